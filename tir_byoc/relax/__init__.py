"""The Relax rewrites that put each GEMM next to its epilogue, and the pipeline that runs them.

One module per rewrite, named after it:

- :mod:`.wrap_indices`: negative gather indices read as torch reads them;
- :mod:`.convolutions`: convolutions as im2col and a GEMM (built by :mod:`.im2col`);
- :mod:`.linear_reshapes`: the reshapes around a Linear on an N-D activation folded away (its
  conditions in :mod:`.linear_reshape_checks`);
- :mod:`.slice_splits`: a packed q/k/v split read as slices;
- :mod:`.untranspose`: attention's ``q @ k^T`` on K as it is;
- :mod:`.fuse_rows`: an elementwise producer fused into the row reduction after it;
- :mod:`.weight_copies`: GEMMs on transposed or broadcast weights read the weight itself (the
  S-TIR proof in :mod:`.copy_map`, the call sites in :mod:`.copy_sites`).

One protocol for every rewrite: find the sites and the declines, then rewrite.  Each rewrite
module has

- ``find(mod) -> (sites, declines)``: the places it rewrites, as immutable records, and the
  candidates it leaves alone, each a :class:`~tir_byoc.decline.Decline` with the reason (empty
  where the rewrite has none to report), which :func:`tir_byoc.explain` lists; nothing is
  rewritten;
- ``rewrite(mod, sites) -> IRModule``: those sites rewritten; ``mod`` itself when there are
  none, and ``mod`` is never modified;
- its module pass, a ``@tvm.transform.module_pass`` class that runs the two
  (``WrapIndices()(mod)``).

:mod:`.weight_copies` alone takes a second argument to ``find`` (and to its pass): the plan a
rewritten callee would get, since a copy is folded only where an intrinsic then serves the GEMM.

The layers: :mod:`.analysis` holds the facts more than one rewrite reads; no rewrite imports
another, only :mod:`.analysis`, its own helper modules and the rest of ``tir_byoc`` below it
(``match``); :mod:`.pipeline` imports them all and holds the whole order, from a Relax module
to what the Relax VM runs, registered with TVM as ``relax.get_pipeline("tir_byoc")``.
"""
