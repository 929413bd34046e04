"""The analytic cost model, NCCL's own tuning model, and the tuner built on them.

* :mod:`collsim.model.params` -- :class:`ModelParams`, the physical knobs (serialisable);
* :mod:`collsim.model.analytic` -- :class:`AnalyticModel`, closed forms per algorithm family
  (:mod:`~collsim.model.rings`, :mod:`~collsim.model.trees`, :mod:`~collsim.model.exchange`,
  :mod:`~collsim.model.rd`) over the topology's routes, vectorised over sizes;
* :mod:`collsim.model.nccl` -- NCCL's tuning model (the baseline);
* :mod:`collsim.model.tuner` -- the best (algorithm, protocol, channels) per size.
"""

from collsim.model.analytic import AnalyticModel, effective_bytes
from collsim.model.params import DEFAULT_PARAMS, ModelParams, ProtocolParams

__all__ = ["DEFAULT_PARAMS", "AnalyticModel", "ModelParams", "ProtocolParams", "effective_bytes"]
