"""Writes the torch.distributed.pipelining schedules that schedule_test.cc checks Tandem against.

Made once, with PyPI torch 2.15 (CPU build), from the repository root:

    /tmp/torch2/bin/python tests/common/testdata/make_torch_schedules.py tests/common/testdata

Each CSV file is written by torch's own `_dump_csv` (compute_comms, the default, or
compute_only) of a schedule object built as torch's _schedule_visualizer builds one: with mock
stages, no process group. With `--orders` it also prints the compute-only order of every rank
of ScheduleDualPipeV for the (P, M) schedule_test.cc lists, as the C++ table there holds them.
"""
import os
import sys
from unittest import mock

import torch
from torch.distributed.pipelining import schedules
from torch.distributed.pipelining.stage import PipelineStage

# (file, schedule class, P, M, format); every multi-stage schedule torch exports as CSV.
FILES = [
    ("dualpipe_v_P4_M8", schedules.ScheduleDualPipeV, 4, 8, "compute_comms"),
    ("dualpipe_v_P4_M8_compute_only", schedules.ScheduleDualPipeV, 4, 8, "compute_only"),
    ("zb_v_P2_M4", schedules.ScheduleZBVZeroBubble, 2, 4, "compute_comms"),
    ("interleaved_zb_P2_M4_compute_only", schedules.ScheduleInterleavedZeroBubble, 2, 4,
     "compute_only"),
]
ORDERS = [(1, 2), (2, 4), (2, 5), (3, 6), (4, 8), (4, 10), (8, 16)]


def build(cls, num_ranks, num_micro_batches, chunks=2):
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank = 0
    stage.group_size = num_ranks
    stage.submod = None
    stage.num_stages = chunks * num_ranks
    return cls([stage] * chunks, num_micro_batches)


def main():
    out_dir = sys.argv[1]
    version = torch.__version__.split("+")[0].replace(".", "_")
    for name, cls, p, m, fmt in FILES:
        path = os.path.join(out_dir, f"torch_{version}_{name}.csv")
        build(cls, p, m)._dump_csv(path, format=fmt)
        print("wrote", path)
    if "--orders" in sys.argv:
        for p, m in ORDERS:
            order = build(schedules.ScheduleDualPipeV, p, m).pipeline_order
            rows = [" ".join(str(a) for a in order[r] if a is not None) for r in range(p)]
            print(f"{{{p}, {m}, {{" + ", ".join(f'"{row}"' for row in rows) + "}},")


if __name__ == "__main__":
    main()
