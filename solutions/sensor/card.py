"""The sensor vertical's part of a model card: intended use and known limitations."""

from __future__ import annotations

TITLE = "Sensor RUL / failure-within-horizon model (1D-CNN, TCN or patch-transformer encoder over aligned sensor windows)"
INTENDED_USE = (
    "Estimates the remaining useful life (RUL, in grid steps) of each asset from its latest window of "
    "aligned sensor readings and the probability that it fails within the horizon, to plan "
    "maintenance and to raise alerts for inspection. Decision support for maintenance planners; "
    "not a safety interlock and not a substitute for the manufacturer's limits."
)
LIMITATIONS = (
    ("RUL is capped during training (rul_cap): predictions far from failure say 'healthy for a long "
     "time', not how long; the interval of RMSE is measured on the capped target."),
    ("Trained on the failure modes and operating regimes present in the training assets; a new "
     "regime or sensor drift degrades it until it is retrained (watch drift on the inputs)."),
    ("Few failed assets in the test split make the RUL and alert figures noisy; read the intervals."),
    ("Assets whose sensors are missing or stuck get imputed windows; the bad-reading counts of a "
     "scoring run say how many."),
)
