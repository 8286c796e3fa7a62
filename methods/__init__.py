"""Methods, one file each; importing this package registers them all."""
from methods import deep_ensemble, kep_svgp, mc_dropout, msp, sgpa, temperature_scaling  # noqa: F401
