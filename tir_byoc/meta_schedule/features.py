"""The features MetaSchedule's cost model sees of an offloaded candidate.

Entry point: :func:`cost_model`, the ``"xgb"`` cost model of a tuning run, given
:class:`OffloadFeatures`.

MetaSchedule's default extractor (``PerStoreFeature``) gives one feature row per buffer store.
A candidate whose blocks were all offloaded stores nothing (its body is the library call), so
it gets no row, and the XGBoost model does not expect that: ``PackSum`` builds its row-to-
candidate ids from the rows, so a batch without a row has float ids and ``predict`` raises
``TypeError: Cannot cast array data from dtype('float64') to dtype('int64')``, and a batch
whose last candidates have none gets fewer scores than candidates.  :class:`OffloadFeatures`
gives such a candidate one row of zeros, so the model scores it like any other and learns its
measured time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import XGBModel
from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature, PyFeatureExtractor


@derived_object
class OffloadFeatures(PyFeatureExtractor):
    """``PerStoreFeature``, with one row of zeros for a candidate that stores nothing."""

    def __init__(self):
        self.per_store = PerStoreFeature(extract_workload=True)

    def extract_from(self, context, candidates):
        features = self.per_store.extract_from(context, candidates)
        return [
            tvm.runtime.tensor(np.zeros((1, f.shape[1]), dtype=f.dtype)) if f.shape[0] == 0 else f
            for f in features
        ]


def cost_model(num_tuning_cores: int) -> XGBModel:
    """MetaSchedule's ``"xgb"`` cost model (as ``ms.tune.tune_tasks`` makes it) on
    :class:`OffloadFeatures`."""
    return XGBModel(
        extractor=OffloadFeatures(), num_tuning_cores=num_tuning_cores, tree_method="auto"
    )
