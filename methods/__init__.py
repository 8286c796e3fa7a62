"""Methods, one file each; importing this package registers them all."""
from methods import deep_ensemble, mc_dropout, msp, temperature_scaling  # noqa: F401
