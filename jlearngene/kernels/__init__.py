"""Compiled kernels that XLA calls through its FFI, with XLA fallbacks.

`cpu.weight_grad(x, g)` is xᵀ·g, a dense layer's weight gradient, and
`attention.attention(qkv, scale)` is multi-head softmax attention (forward and backward),
each in an AVX-512 or AVX2 C++ kernel built at first use; see `jlearngene.kernels.cpu` and
`jlearngene.kernels.attention`.
"""
