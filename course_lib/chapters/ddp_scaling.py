"""Notebook 05's claims and advice: the articles' DDP rules of thumb (85% scaling efficiency at 4
GPUs, act when communication passes 15% of a step, stage 3's 2.5x) applied to what `engine.ddp`
measured, as `analysis.claims` records and as advice lines (`workbook ddp --scaling` prints them)."""
from __future__ import annotations

from course_lib.analysis import claims as claim
from course_lib.devices import physical_cores
from course_lib.engine.ddp import ScalingReport, efficiency_interval

# The articles' rules of thumb.
EFFICIENCY_TARGET = 0.85  # "4-GPU DDP should reach 85% scaling efficiency or better"
COMMUNICATION_LIMIT = 0.15  # "when communication is more than 15% of the step, act"
ARTICLE_STAGE3_SPEEDUP = 2.5  # "4 GPUs: about 2.5x over single-GPU AMP" (13 min -> ~5 min per epoch)
ARTICLE_EXAMPLE_MINUTES = (100.0, 35.0)  # 1 GPU 100 min, 4 GPUs 35 min: "71%, low"


def communication_verdict(share: float) -> str:
    return "act: communication above 15%" if share > COMMUNICATION_LIMIT else "fine: 15% or less"


def scaling_advice(report: ScalingReport, *, cores: int | None = None, threads_per_process: int = 1) -> list[str]:
    """The articles' rules applied to the measured numbers, and what follows from them."""
    table, communication = report.table, report.communication
    workers = int(table["workers"].max())
    strong, weak = report.efficiency("strong"), report.efficiency("weak")
    advice = []
    where = "at 4 GPUs" if workers == 4 else f"at {workers} workers (the articles' figure is for 4 GPUs)"
    verdict = "meets" if strong >= EFFICIENCY_TARGET else "misses"
    advice.append(f"Strong-scaling efficiency {strong:.0%} {where} {verdict} the >= 85% rule; "
                  f"weak scaling (same per-worker batch) reaches {weak:.0%}.")
    if weak > strong + 0.05:
        advice.append("Weak scaling beats strong scaling: each worker's share of a fixed global batch is too small "
                      "to hide the all-reduce. Keep the per-worker batch large (raise the global batch with "
                      "the worker count, scaling the learning rate).")
    share = communication.get("profiled_share")
    if share is not None:
        exposed = communication.get("exposed_share", 0.0)
        advice.append(f"All-reduce share of a step: {share:.0%} inside all-reduce events by torch.profiler (the "
                      f"articles' measure; it counts time overlapped with backward) and {exposed:.0%} exposed (what "
                      f"skipping the all-reduce under no_sync saves, including DDP's bucket copies and, on CPU, gloo's "
                      f"threads competing for the cores). Rule on the exposed share: {communication_verdict(exposed)}.")
        if share > COMMUNICATION_LIMIT >= exposed:
            advice.append("The profiler alone would say act, but DDP hides most of the all-reduce behind backward: "
                          "look at the exposed share before changing anything.")
        if exposed > COMMUNICATION_LIMIT:
            advice.append("Communicate less often or less: gradient accumulation (accumulation_steps=k) all-reduces "
                          "once per k micro-batches because the engine runs the others under DDP's no_sync(); a larger "
                          "per-worker batch gives backward more computation to hide the all-reduce behind.")
            if report.device.startswith("cuda"):
                advice.append("On GPUs: check `nvidia-smi topo -m`; over PCIe rather than NVLink try NCCL_P2P_LEVEL "
                              "(e.g. NVL or PIX) and compare; multi-node: NCCL_IB_DISABLE=0 on InfiniBand, tune "
                              "NCCL_BUFFSIZE; a larger DDP bucket_cap_mb or an fp16 compression comm hook.")
    if report.device == "cpu":
        cores = cores or physical_cores()
        if workers * threads_per_process > cores:
            advice.append(f"{workers} processes x {threads_per_process} thread(s) oversubscribe this machine's {cores} "
                          "cores: the workers compete for the same cores, so no scaling is possible here.")
        if report.load_average is not None and report.load_average > max(cores, workers) + 0.5:
            advice.append(f"The 1-minute load average was {report.load_average:.1f} on {cores} cores: other processes "
                          "competed with the workers, so these times are noisy; rerun on an idle machine.")
        advice.append(f"On CPU, DDP adds workers but not cores: {workers} workers with {threads_per_process} "
                      f"thread(s) each on {cores} cores, gradients all-reduced by gloo over loopback TCP. "
                      "Efficiency here says little about GPUs with NCCL; rerun with profile=gpu.")
    return advice


def claims(report: ScalingReport, equivalence: dict | None = None) -> list:
    """The articles' DDP claims as `analysis.claims.Claim`s: the 85% rule (measured only on 4 or more
    CUDA GPUs, else not measurable here, with what was measured instead), the article's 71% example,
    the 15% communication rule, stage 3's 2.5x and, when given, the 1-worker equivalence check."""
    workers = int(report.table["workers"].max())
    strong = report.table[report.table["mode"] == "strong"].sort_values("workers").iloc[-1]
    interval = efficiency_interval(report)
    efficiency, low, high = ((interval["efficiency"], interval["low"], interval["high"]) if interval
                             else (float(strong["efficiency"]), None, None))
    measured_here = (f"{efficiency:.0%} strong-scaling efficiency at {workers} worker(s) on {report.device} "
                     f"({report.precision})" + (f", 95% interval [{low:.0%}, {high:.0%}] over repeated steps"
                                                if low is not None else ""))
    gpus = report.device.startswith("cuda") and workers >= 4
    if gpus:
        efficiency_claim = claim.measured("ddp_efficiency", 100 * efficiency,
                                          (100 * low, 100 * high) if low is not None else None,
                                          reason=f"{measured_here}; T1 / (N x TN) at the same global batch")
    else:
        caveat = (" (processes sharing the same cores, gradients through gloo: a lower bound that says little "
                  "about NCCL on GPUs)" if report.device == "cpu" else "")
        efficiency_claim = claim.not_measurable(
            "ddp_efficiency", f"needs 4 or more CUDA GPUs; measured instead: {measured_here}{caveat}")
    single, four = ARTICLE_EXAMPLE_MINUTES
    single_worker_seconds = report.table.query("mode == 'strong' and workers == 1")["epoch_seconds"].iloc[0]
    example = single / (4 * four)
    rows = [efficiency_claim, claim.checked(
        "ddp_article_example", example < EFFICIENCY_TARGET,
        reason=f"T1 / (N x TN) = {single:g} / (4 x {four:g}) = {example:.1%}, below the 85% bar; the same formula "
               f"here: T1 {single_worker_seconds:.2f} s, T{workers} {strong['epoch_seconds']:.2f} s per epoch")]
    share = report.communication.get("profiled_share")
    if share is None:
        rows.append(claim.not_measurable("ddp_communication_share", "one worker: nothing to communicate"))
    else:
        exposed = report.communication.get("exposed_share", 0.0)
        # The rule holds here when acting on it is consistent with the efficiency it protects: above 15%
        # exposed goes with a missed 85%, at or below 15% with the cause of any miss lying elsewhere.
        consistent = exposed <= COMMUNICATION_LIMIT or efficiency < EFFICIENCY_TARGET
        rows.append(claim.checked(
            "ddp_communication_share", consistent,
            reason=f"profiled {share:.0%} of a step inside all-reduce events (includes overlap with backward), "
                   f"exposed {exposed:.0%} (no_sync): {communication_verdict(exposed)}; efficiency {efficiency:.0%}"))
    stage3 = (f"{strong['speedup']:.2f}x with {workers} worker(s) at the same global batch; 2.5x on 4 GPUs is "
              f"{ARTICLE_STAGE3_SPEEDUP / 4:.1%} efficiency, below the articles' own 85% bar")
    rows.append(claim.checked("ddp_stage3_speedup", strong["speedup"] >= 0.75 * ARTICLE_STAGE3_SPEEDUP,
                              reason=stage3) if gpus
                else claim.not_measurable("ddp_stage3_speedup", f"needs 4 CUDA GPUs; measured instead: {stage3}"))
    if equivalence is not None:
        rows.append(claim.checked(
            "ddp_equivalence", bool(equivalence["equal"]),
            reason=f"max |weight difference| after {equivalence['steps']} steps: "
                   f"{equivalence['max_abs_difference']:.1e} ({equivalence['world_size']} workers, "
                   f"{equivalence['nnodes']} node(s)), tolerance {equivalence['tolerance']:g}"))
    return rows
