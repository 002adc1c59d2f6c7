"""The K2 model in torch: ``model`` (the trained target, an nn.Module; MLA naive or absorbed), ``layer``
(one layer as the stock-PyTorch baseline ``bench k2`` times: absorbed MLA, grouped GEMM experts, CUDA
graph capturable), the pieces both use (``layers``: RMSNorm, rope, the noaux_tc router) and the INT4
helpers (``int4``)."""
