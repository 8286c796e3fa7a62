"""Methods, one file each; importing this package registers them all."""
from methods import (  # noqa: F401
    cgpt,
    ddu,
    deep_ensemble,
    kdeformer,
    kep_svgp,
    laplace_last_layer,
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
