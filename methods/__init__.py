"""Methods, one file each; importing this package registers them all."""
from methods import (  # noqa: F401
    ddu,
    deep_ensemble,
    kdeformer,
    kep_svgp,
    mc_dropout,
    msp,
    pay_attention,
    rff_gp_attention,
    rpc,
    scaled_attention,
    sgpa,
    sngp,
    temperature_scaling,
)
