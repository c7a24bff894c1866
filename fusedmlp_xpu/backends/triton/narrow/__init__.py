"""The narrow family: MLPs with every width <= 128 as ONE kernel (a block of rows read
once, run through every layer on chip, only the output written).

    tuning.py            which nets are narrow; tunings and backward splits per vendor
    launchers.py         the kernels' launchers, constexprs, persistent grid size
    operands.py          weights and biases as the kernels take them
    forward.py           the forward's host side (plans, direct launches)
    forward_kernels.py   the Triton forward kernels
    backward.py          the backward's host side (fused, split or one kernel)
    backward_kernels.py  the Triton backward kernels and the gradients' reduction
    reduce.py            the per-program partial sums -> every weight and bias gradient
    tiles.py             tile helpers both kernel files share
    hopper_forward.py    the inference forward on sm_90 (Hopper), in Gluon
    hopper_backward.py   the recomputing backward on sm_90 (Hopper), in Gluon
"""
