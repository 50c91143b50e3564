"""The Relax rewrites that put each GEMM next to its epilogue, and the pipeline that runs them.

One module per rewrite, named after it:

- :mod:`.wrap_indices`: negative gather indices read as torch reads them;
- :mod:`.convolutions`: convolutions as im2col and a GEMM;
- :mod:`.linear_reshapes`: the reshapes around a Linear on an N-D activation folded away;
- :mod:`.slice_splits`: a packed q/k/v split read as slices;
- :mod:`.untranspose`: attention's ``q @ k^T`` on K as it is;
- :mod:`.fuse_rows`: an elementwise producer fused into the row reduction after it;
- :mod:`.weight_copies`: GEMMs on transposed or broadcast weights read the weight itself.
"""
