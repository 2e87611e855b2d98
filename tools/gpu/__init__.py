"""Tools run on the lent GPU machines (tools/gpu/bcc-env.sh puts the repository on PYTHONPATH)."""
