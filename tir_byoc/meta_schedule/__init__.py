"""MetaSchedule integration: offload inside tuning, measured against the natively tuned schedule.

Entry points: :func:`tune_tir` and :func:`tune_relax` (one call: tune, then return the final
module ready for ``tvm.compile``), :func:`offload_space` (a space generator usable as ``space=``
of ``ms.tune_tir``), its parts :class:`OffloadRule` and :class:`OffloadPostproc`,
:func:`candidate_builder` (a ``LocalBuilder`` whose artifacts carry the intrinsic code) and
:func:`load_report` (which variant won, per function).

The modules, laid out like TVM's own ``tvm.s_tir.meta_schedule`` (each imports only those
above it in this list, and ``tir_byoc.planning`` / ``tir_byoc.rewrite`` for the one plan of a
function and its rewrite):

- ``rule.py``: :class:`OffloadRule`, the annotations it writes (:data:`CHOICE_ATTR`,
  ``KEEP_LOOP_ATTR``, the ``schedule_rule`` value ``CUSTOM_RULE`` and its registration) and
  their readers (:func:`recorded_choice`), the offload :data:`MODES` and the target check.
- ``postproc.py``: :class:`OffloadPostproc`, which reads the rule's marks and rewrites each
  candidate, and the counter of rejected candidates.
- ``space.py``: :func:`offload_space` (rule + postproc in the target's default space) and
  :func:`candidate_builder`.
- ``progress.py``: :class:`Progress`, the measure callback that prints and counts trials.
- ``measure.py``: :func:`~.measure.measure`, candidates measured again after the search: an
  offloaded one with its constant weights packed, a function's default-rule schedule.
- ``report.py``: :class:`FunctionReport`, :class:`TuningReport`, :func:`load_report` and
  :data:`REPORT_FILE`.
- ``options.py``: ``TuneOptions``, the ``**options`` of :func:`tune_tir` checked once.
- ``tasks.py``: which functions become which tuning tasks (:data:`VARIANT_ATTR`).
- ``records.py``: :func:`apply_record`, a best record replayed with its chains offloaded.
- ``search.py``: every task tuned in one search over the space (a first round for the
  functions tuned in both variants).
- ``decide.py``: per function, the faster variant's best record (offloaded ones measured again
  with their constant weights packed), and a function left to TVM measured against the default
  rules' schedule.
- ``tune.py``: :func:`tune_tir` and :func:`tune_relax` (options -> tasks -> the search -> the
  decision per function -> the report).
- ``specialize.py``: a symbolic PrimFunc's dims at each size (read from its calls), its static
  copy at one size, and the dispatcher that runs each tuned copy where its dims take that
  size's values.
- ``dispatch.py``: per symbolic function, the tuned copies it dispatches to (each measured
  again beside the symbolic schedule at its size, the faster kept) and the dispatcher written.
- ``sizes.py``: a build with symbolic dims tuned at the sizes ``build_model``'s
  ``tune_sizes`` names (``checked_sizes``, ``tune_by_size``): the static copies tuned in one
  :func:`tune_tir` run, each symbolic function then a dispatcher.

How a matched chain travels through the search:

1. :class:`OffloadRule` runs first among the schedule rules.  For the blocks of a chain that an
   intrinsic can serve it returns the offloaded variant, the native one, or both
   (``offload="always" | "never" | "choice"``).  Offloaded blocks are annotated
   ``tir_byoc.choice = "offload"`` and ``schedule_rule = "tir_byoc_offload"``, so every later
   rule leaves their loops alone (MetaSchedule skips blocks carrying ``schedule_rule``;
   ``ApplyCustomRule`` calls the registered no-op
   ``s_tir.meta_schedule.<target key>.tir_byoc_offload``), and their loops are annotated
   ``tir_byoc.keep_loop`` so that ``RewriteParallelVectorizeUnroll`` skips them; native ones
   are annotated ``tir_byoc.choice = "native"`` and tuned like any other block.  The
   annotations are traced, so every record in the tuning database says which variant it
   measured.
2. :class:`OffloadPostproc` runs among the postprocs, right before ``RewriteReductionBlock``
   (see :func:`offload_space` for why there).  It applies the matcher and
   :func:`tir_byoc.rewrite.rewrite_function` (the same core as :func:`tir_byoc.offload`) to
   every candidate and replaces the schedule's function body; a candidate whose chosen chain no
   longer matches or cannot be rewritten is rejected, with the reason logged.
3. Candidates are built by :func:`candidate_builder` into shared libraries that link the
   intrinsic objects, so ``LocalRunner`` and ``RPCRunner`` workers load them without tir_byoc.
4. :func:`tune_tir` and :func:`tune_relax` (``offload="choice"``, the default) tune each
   function with chains as two tasks, ``<name>@offload`` and ``<name>@native``, whose
   workloads differ only by the function attribute ``tir_byoc.variant``: the task scheduler
   gives both trials, so both are measured, and the faster best record is replayed (with the
   postproc applied again, :func:`apply_record`) into the final module.  With
   ``offload="always"`` a function made only of offloaded chains gets no task at all.
5. In a Relax module, a function whose offloaded chains read constant weights has its best
   offloaded record measured once more with the weights packed (``measure.py``; the backend
   chooses each form by timing, as :func:`tir_byoc.offload` does), and that is the offloaded
   time compared; if offload wins, the Relax calls passing the constants call the packed
   variant (:func:`tir_byoc.packing.install_packed`).
"""

from .postproc import OffloadPostproc
from .progress import Progress
from .records import apply_record
from .report import REPORT_FILE, FunctionReport, TuningReport, load_report
from .rule import CHOICE_ATTR, MODES, OffloadRule, recorded_choice
from .rule import CUSTOM_RULE as CUSTOM_RULE
from .rule import KEEP_LOOP_ATTR as KEEP_LOOP_ATTR
from .space import candidate_builder, offload_space
from .tasks import VARIANT_ATTR
from .tune import tune_relax, tune_relax_reported, tune_tir

# The public API.  CUSTOM_RULE and KEEP_LOOP_ATTR, the annotations the rule puts on an offloaded
# chain, are reachable here (as they were) without being part of it.
__all__ = [
    "CHOICE_ATTR",
    "MODES",
    "REPORT_FILE",
    "VARIANT_ATTR",
    "FunctionReport",
    "OffloadPostproc",
    "OffloadRule",
    "Progress",
    "TuningReport",
    "apply_record",
    "candidate_builder",
    "load_report",
    "offload_space",
    "recorded_choice",
    "tune_relax",
    "tune_relax_reported",
    "tune_tir",
]
