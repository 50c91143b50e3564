"""The builder of tuning candidates, whose worker processes live from one batch to the next.

Entry point: :class:`CandidateBuilder`, what :func:`~.space.candidate_builder` returns.

TVM's ``LocalBuilder`` starts its worker processes anew for every batch of candidates (its
comment: long-lived workers leak memory).  Each new worker imports TVM, and through ``tvm_ffi``
PyTorch: about 5 s of CPU on the 2-vCPU VMs, where a batch of a small model's candidates builds
in a second.  A tuning run of 8 trials on a two-layer MLP made 13 batches and spent 27 of its
58 s waiting for them.  This builder runs the same build in the same kind of workers (TVM's
``PopenPoolExecutor``, each candidate built and exported by ``f_build`` and ``f_export`` as
``LocalBuilder`` does it), but keeps one pool for as long as the builder is used, and replaces
each worker after ``process_uses`` candidates, which bounds a leak the same way.  A tuning call
that makes its own builder closes it when it is done (:meth:`CandidateBuilder.close`).
"""

from __future__ import annotations

from collections.abc import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder import local_builder as _local
from tvm.s_tir.meta_schedule.utils import cpu_count
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

#: Candidates a worker builds before it is replaced by a fresh process.
PROCESS_USES = 64


@derived_object
class CandidateBuilder(PyBuilder):
    """``LocalBuilder``'s build in worker processes kept across batches.

    Parameters
    ----------
    f_build, f_export : callable or str
        As for ``LocalBuilder``: build an ``IRModule`` for a target, export the result and
        return its path (a registered function's name, or a callable the workers can unpickle).
    max_workers : int, optional
        Worker processes (default: one per logical CPU, as ``LocalBuilder``).
    timeout_sec : float
        A candidate that takes longer fails with a timeout (its worker is replaced).
    initializer : callable, optional
        Run once in each worker when it starts.
    process_uses : int
        Candidates a worker builds before it is replaced (:data:`PROCESS_USES`).
    """

    def __init__(
        self,
        *,
        f_build: Callable | str,
        f_export: Callable | str,
        max_workers: int | None = None,
        timeout_sec: float = 30.0,
        initializer: Callable[[], None] | None = None,
        process_uses: int = PROCESS_USES,
    ) -> None:
        super().__init__()
        if not isinstance(process_uses, int) or isinstance(process_uses, bool) or process_uses < 1:
            raise ValueError(
                "tir_byoc.meta_schedule.CandidateBuilder: expected process_uses to be an "
                f"int >= 1, got {process_uses!r}"
            )
        self.f_build = f_build
        self.f_export = f_export
        self.max_workers = cpu_count(logical=True) if max_workers is None else max_workers
        self.timeout_sec = timeout_sec
        self.initializer = initializer
        self.process_uses = process_uses
        self._pool = None

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self._pool is None:
            self._pool = PopenPoolExecutor(
                max_workers=self.max_workers,
                timeout=self.timeout_sec,
                initializer=self.initializer,
                maximum_process_uses=self.process_uses,
            )
        jobs = [
            (self.f_build, self.f_export, i.mod, i.target, _local._serialize_params(i.params))
            for i in build_inputs
        ]
        return [
            _result(outcome, self.timeout_sec)
            for outcome in self._pool.map_with_error_catching(
                lambda job: _local._worker_func(*job), jobs
            )
        ]

    def close(self) -> None:
        """Stop the worker processes (a later :meth:`build` starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _result(outcome, timeout_sec: float) -> BuilderResult:
    """A ``BuilderResult`` from one worker's outcome, with the message ``LocalBuilder`` gives."""
    if outcome.status == StatusKind.COMPLETE:
        return BuilderResult(outcome.value, None)
    if outcome.status == StatusKind.TIMEOUT:
        return BuilderResult(None, f"LocalBuilder: Timeout, killed after {timeout_sec} seconds")
    if outcome.status == StatusKind.EXCEPTION:
        return BuilderResult(None, f"LocalBuilder: An exception occurred\n{outcome.value}")
    raise ValueError(f"tir_byoc.meta_schedule: a builder worker gave {outcome.status}")


def close_if_owned(builder, given) -> None:
    """Close ``builder`` if the tuning call made it (``given``, its option, was None)."""
    if given is None and isinstance(builder, CandidateBuilder):
        builder.close()
