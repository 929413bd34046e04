"""Calibration: real measurements (nccl-tests logs, the torch benchmark) read into one form.

``read_log`` turns any nccl-tests output (text in either table layout, or ``-J`` JSON) into an
:class:`NcclTestsLog`; ``collsim calibrate run`` produces such logs on a real cluster; fitting and
validation build on these.
"""

from collsim.calibration.nccltests import NcclTestsLog, Row, read_log, read_logs

__all__ = ["NcclTestsLog", "Row", "read_log", "read_logs"]
