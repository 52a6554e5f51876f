"""Calibrated sculpting (--calibrate): the calibration data and the layer-at-a-time runner.

:mod:`~smoe.sculpt.calibrate.data` reads and checks DATA; :mod:`~smoe.sculpt.calibrate.runner`
runs the model's own forward pass one decoder layer at a time and gathers each routed
expert's input statistics; :mod:`~smoe.sculpt.calibrate.run` drives a sculpt through it
layer by layer; :mod:`~smoe.sculpt.calibrate.layers` reads the quantised experts back and
estimates their output error. torch and transformers (the ``calibrate`` extra) are
imported only when a calibration runs.
"""

from smoe.sculpt.calibrate.data import CalibrationData, load_calibration

__all__ = ["CalibrationData", "load_calibration"]
