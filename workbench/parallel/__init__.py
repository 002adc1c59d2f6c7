"""Expert parallelism over torch.distributed: the expert and token split (``experts``), the expert-parallel
MoE block (``ep_moe``), its phase timer (``phases``) and a time-bounded process launcher (``launch``)."""
