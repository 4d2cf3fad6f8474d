"""The variants of ``qconform.bench.ggml_gemv`` (described there): each one's contract order, which selects
its kernel, and its build options; kept apart from the bench (no CuPy) so that host tests read them."""

from qconform.bench.records import STREAM_ORDER

# the shipped build without the activations' quantize letting the GEMV start early: the GEMV
# (its programmatic dependent) starts as the quantize's CTAs exit (-DQK_PDL_TRIGGER_AT_EXIT)
TRIGGER_AT_EXIT = "trigger_at_exit"
# the launcher's order for each variant: the contract that selects its kernel
VARIANTS = {
    "exact": "reference",
    "fast-v1": "any",
    "fast": "any",
    STREAM_ORDER: "any",
    TRIGGER_AT_EXIT: "any",
    "loads_first": "any",
    "two_launch": "any",
    "no_prefetch": "any",
    "wait_first": "any",
    "wait_first_sm": "any",
    "staged": "any",
    "bulk_s2": "any",
}
V1_OPTION = "-DQK_KQ_FAST_V1"  # the build option of round 1's fast kernel (keep_quant_fast.hip)
# the build options of each fast variant
OPTIONS = {
    "fast-v1": (V1_OPTION,),
    TRIGGER_AT_EXIT: ("-DQK_PDL_TRIGGER_AT_EXIT",),
    # the GEMV's first weight loads issued before its wait for the quantize (bench-only)
    "loads_first": ("-DQK_KF_LOADS_FIRST",),
    # Q4_K / Q5_K at M = 1 as two launches, the quantize and the GEMV (bench-only)
    "two_launch": ("-DQK_KF_TWO_LAUNCH",),
    # the one-launch call without its waiting CTAs' prefetch of their next row group (bench-only)
    "no_prefetch": ("-DQK_KF_ONE_PREFETCH=0",),
    # the one launch's first trip loaded after the wait: by every CTA, or by those on an SM that a
    # quantizing CTA published (bench-only diagnostics)
    "wait_first": ("-DQK_KF_FIRST_AFTER_WAIT=1",),
    "wait_first_sm": ("-DQK_KF_FIRST_AFTER_WAIT=3",),
    # Q6_K / Q8_0 at M = 1 as before session 41, or the bulk copy's ring with 2 slots (bench-only)
    "staged": ("-DQK_KF_STAGED",),
    "bulk_s2": ("-DQK_KF_BULK_STAGES=2",),
}
DEFAULT_BUILD = ("exact", "fast", STREAM_ORDER)  # the variants on the shipped build (no OPTIONS entry)


def unbuilt(variants: dict[str, str], options: dict[str, tuple[str, ...]]) -> list[str]:
    """The variants that would time the shipped build under another name: neither in ``options`` nor
    ``DEFAULT_BUILD`` (and the options of no variant)."""
    return [v for v in variants if v not in options and v not in DEFAULT_BUILD] + [
        o for o in options if o not in variants
    ]


# the variants that change only some types' kernels: those types (every other fast variant: FAST_TYPES)
ROUND2, BULK = ("Q4_K", "Q5_K"), ("Q6_K", "Q8_0")  # round 2's types (fast-v1 is round 1), the bulk kernel's
VARIANT_TYPES = {
    "fast-v1": ROUND2,
    "no_prefetch": ROUND2,
    "wait_first": (*ROUND2, *BULK),
    "wait_first_sm": (*ROUND2, *BULK),
    "two_launch": (*ROUND2, *BULK),
    "staged": BULK,
    "bulk_s2": BULK,
}
