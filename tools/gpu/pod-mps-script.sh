#!/bin/bash
# On a GPU host: the example pod's container script (tools/deploy/examples/offline-pod-own-mps.yaml)
# run as is with its environment, outside Kubernetes, and a train.py of two ranks of 8192 bf16
# matmuls for 15 s; writes what nvidia-smi saw and the script's output under $OUT. $1: a name.
set -u
call=${1:-run}
name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "GPU: $name"
work=$(mktemp -d)
cat > $work/train.py <<'PY'
import os, time, torch
rank = int(os.environ.get("LOCAL_RANK", "0"))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
n, end = 0, time.time() + 15
while time.time() < end:
    for _ in range(4):
        torch.matmul(a, b)
    torch.cuda.synchronize(); n += 4
print(f"rank {rank}: {n / 15:.1f} it/s", flush=True)
raise SystemExit(3 if rank == 0 else 0)
PY
python3 - tools/deploy/examples/offline-pod-own-mps.yaml $work/run.sh $work/env.sh <<'PY'
import sys, yaml, shlex
(pod,) = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
(c,) = pod["spec"]["containers"]
open(sys.argv[2], "w").write(c["args"][0])
open(sys.argv[3], "w").write("".join(f"export {e['name']}={shlex.quote(e['value'])}\n" for e in c["env"]))
PY
cat $work/env.sh
( cd $work && source ./env.sh && sh -c "$(cat run.sh)" ) > $OUT/pod-script-$call.txt 2>&1 &
pid=$!
sleep 12
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee $OUT/apps-during-$call.txt
nvidia-smi | tail -8
wait $pid; echo "script exit status: $?"
cat $OUT/pod-script-$call.txt | grep -v Warning | tail -8
sleep 2
echo "MPS processes left: $(ps -eo comm | grep -c nvidia-cuda-mps)"
nvidia-smi --query-compute-apps=pid,process_name --format=csv
