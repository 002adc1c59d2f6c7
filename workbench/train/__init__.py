"""Training a small K2-architecture code model and its DFlash drafter from data every install has.

corpus (pinned pure-Python package sources, a manifest with hashes), humaneval (the evaluation
prompts and the overlap check), tokenizer (byte-level BPE), model / drafter (torch twins of the numpy
reference and drafter), loop (optimiser, checkpoints, logs), recipes (the two training runs),
export (KDTR bundles with provenance), measure (acceptance and drift measurements). docs/training.md.
"""
