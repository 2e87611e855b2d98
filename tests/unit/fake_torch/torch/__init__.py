"""A stand-in for PyTorch, for the doctor's workload processes in tests: matmuls take time, no GPU.

Only what qpolicy/doctor/workload.py calls: randn, matmul, bfloat16, cuda.synchronize, and
cuda.Event, which tools/gpu/matmul.py's online stream makes. A trainer's
n=8192 matmul takes 2 ms, an online n=4096 one 0.3 ms (the shapes' real orders of magnitude).
"""

import time

bfloat16 = "bfloat16"


class _Tensor:
    def __init__(self, n: int) -> None:
        self.n = n


def randn(n: int, m: int, device: str = "cpu", dtype: object = None) -> _Tensor:
    return _Tensor(n)


def matmul(a: _Tensor, b: _Tensor) -> _Tensor:
    time.sleep(0.002 if a.n >= 8192 else 0.0003)
    return a


class cuda:  # the name PyTorch uses
    @staticmethod
    def synchronize() -> None:
        pass

    class Event:  # tools/gpu/matmul.py's online stream makes two, used only when timed
        def __init__(self, enable_timing: bool = False) -> None:
            pass
