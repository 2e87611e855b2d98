from qpolicy.cli import main

main()
