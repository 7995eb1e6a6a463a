"""``labkit advise``: plan a training job on this server (or a saved/sample topology).

    labkit advise --model llama2-7b --seq 4096 --global-batch 64 --precision amp-bf16 \\
        --sample dgx_a100_nv12_8nic_roce
    labkit advise --hf-config config.json --seq 2048 --micro-batch 4 --precision amp-bf16 \\
        --gpus 1 --gpu-memory 141GB --json
"""

from __future__ import annotations

import argparse

from labkit.advise import Job, MachineSource, ModelSource, advise
from labkit.advise.advice import ensure_valid
from labkit.core.cliargs import finite_float, int_between
from labkit.core.errors import LabkitError
from labkit.core.serialize import dumps
from labkit.core.spec import add_flags, filled
from labkit.core.units import parse_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("advise", help="plan a whole training job: layout, memory, placement, settings, launch line",
                       description="The parallel layout that fits with a margin and is fastest by the model, the "
                                   "per-GPU peak and step time, the rank-to-GPU placement, the allocator setting, "
                                   "the DDP bucket size and the torchrun line, each with its evidence.")
    m = p.add_argument_group("model (one of)")
    m.add_argument("--model", metavar="PRESET", help="a model preset (labkit estimate --list-models)")
    m.add_argument("--hf-config", metavar="PATH_OR_TYPE", help="a Hugging Face config.json, or a model type")
    m.add_argument("--factory", metavar="MODULE:FUNCTION", help="your function returning an nn.Module")
    m.add_argument("--layers", type=int_between(1, 512), help="override the config's depth")
    m.add_argument("--hidden", type=int_between(1, 1 << 17), help="override the config's width")
    j = p.add_argument_group("job")
    add_flags(j, "seq", required=("seq",))
    j.add_argument("--global-batch", type=int_between(1, 1 << 24),
                   help="sequences per optimizer step (default: micro-batch x GPUs); give it, --micro-batch or both")
    add_flags(j, "micro_batch", "precision", "optimizer", "recompute", searched=("recompute",),
              notes={"micro_batch": "not given: searched, when --global-batch is given"})
    j.add_argument("--trace", choices=("auto", "on", "off"), default="auto",
                   help="run one fake-mode step of the real model (default: on for --hf-config and --factory)")
    w = p.add_argument_group("machine (one of, or --gpus with --gpu-memory)")
    w.add_argument("--live", action="store_true", help="this server (NVML and nvidia-smi topo -m)")
    w.add_argument("--file", metavar="PATH", help="a saved `nvidia-smi topo -m` or NCCL topology XML")
    w.add_argument("--sample", metavar="NAME", help="a bundled topology sample (labkit topo --list)")
    w.add_argument("--gpus", type=int_between(1, 1 << 20), help="GPUs in all (default: the topology's times --nodes)")
    w.add_argument("--gpu-memory", metavar="SIZE",
                   help="memory per GPU with its unit, e.g. 80GiB or 141GB (a bare number is refused)")
    w.add_argument("--nodes", type=int_between(1, 1 << 16), default=1, help="identical nodes (default 1)")
    w.add_argument("--margin", type=finite_float(ge=0, lt=1), default=0.10, help="memory kept free per GPU, a fraction (default 0.10)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = ModelSource(preset=args.model, hf_config=args.hf_config, factory=args.factory, layers=args.layers,
                        hidden=args.hidden)
    mem = parse_bytes(args.gpu_memory, what="--gpu-memory", require_unit=True) if args.gpu_memory else None
    machine = MachineSource(live=args.live, file=args.file, sample=args.sample, gpus=args.gpus,
                            gpu_memory_bytes=mem, nodes=args.nodes, margin=args.margin)
    gb = args.global_batch
    if gb is None:
        if args.micro_batch is None:
            raise LabkitError("advise: give --global-batch, or --micro-batch (the global batch is then "
                              "micro-batch x GPUs)")
        gb = args.micro_batch * (args.gpus or 1)
    filled(args, "precision", "optimizer")
    job = Job(seq=args.seq, global_batch=gb, micro_batch=args.micro_batch, precision=args.precision,
              optimizer=args.optimizer, recompute=args.recompute)
    ensure_valid(model=model, job=job, machine=machine)
    adv = advise(model, job, machine, trace={"auto": None, "on": True, "off": False}[args.trace])
    if args.json:
        print(dumps(adv))
    else:
        print("\n".join(adv.lines()))
    return 0
