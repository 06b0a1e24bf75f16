"""A configuration in one line (``t=8 p=16 d=8 mbs=1 1f1b zero=1 recompute=full+sp+flash``): the terminal's
table, and the answer that says why a search found nothing."""

from __future__ import annotations

from bubblescope.analysis.planner.evaluate import Plan


def config_label(plan: Plan) -> str:
    c = plan.config
    schedule = c.schedule.name + (f"(v={c.vpp})" if c.vpp > 1 else "")
    flags = "+sp" if c.sequence_parallel else ""
    flags += "+flash" if c.flash_attention else ""
    flags += "+fp8" if c.precision == "fp8" else ""
    flags += "+tp-overlap" if c.tp_comm_overlap else ""
    flags += "+eager" if not c.compile else ""
    flags += "+fp8-all-gather" if c.fp8_all_gather else ""
    flags += "+overlap-param-gather" if c.overlap_param_gather else ""
    flags += f"+grad-{c.grad_reduce}" if c.grad_reduce != "fp32" else ""
    stages = f" layers={'/'.join(map(str, c.layers_per_stage))}" if c.layers_per_stage else ""
    context = f" cp={c.cp}({c.cp_comm})" if c.cp > 1 else ""
    context += f" ep={c.ep}" if c.ep > 1 else ""
    context += f" etp={c.etp}" if c.etp else ""
    context += f"({c.dispatcher})" if c.ep > 1 and c.dispatcher != "alltoall" else ""
    flags += f"+{c.attention_kernel}" if c.attention_kernel != "cudnn" else ""
    flags += "+kv-repeated" if c.kv_repeated else ""
    flags += f"+{c.projections.replace('_', '-')}-projections" if c.projections != "fused" else ""
    return (
        f"t={c.tp}{context} p={c.pp} d={c.dp} mbs={c.mbs} {schedule if c.pp > 1 else 'no-pp'} "
        f"zero={c.zero} recompute={c.recompute}{flags}{stages}"
    )
