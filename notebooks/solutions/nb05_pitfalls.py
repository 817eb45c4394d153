"""Solutions to the exercises of notebook 05 (pitfalls and diagnostics). Try them yourself first.

Each ``exercise_<k>`` holds the code of exercise k's cell. Its arguments are the notebook variables that cell uses
(same names, lower case where the notebook uses capitals), and it returns what the check cell passes to the check.
``tests/test_exercises.py`` runs every solution against its check, so these stay working as PyTorch moves.
"""
import copy

import torch

from cudagraph_kit import check_capturable
from cudagraph_kit import capture
from cudagraph_kit import verify


def exercise_1(device, cuda):
    """Section 5's ScaledByStep with its counter in a buffer, updated in place: the graph replays the update."""
    class ScaledByStepFixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.register_buffer("step", torch.zeros(()))  # a buffer: .to(DEVICE) moves it with the model

        def forward(self, x):
            self.step.add_(1)                               # in place: a kernel the graph replays
            return self.lin(x) / self.step

    x = torch.randn(4, 16, device=device)
    print(check_capturable(ScaledByStepFixed().to(device), x))
    counter_verify = ...
    if cuda:
        model = ScaledByStepFixed().to(device)
        reference = copy.deepcopy(model)                    # its own counter: each call advances one
        g = capture(model, x)
        counter_verify = verify(g, reference, x, state=[(model, reference)])
        print(counter_verify)
    return {"ScaledByStepFixed": ScaledByStepFixed, "counter_verify": counter_verify}


def exercise_2(x, cuda):
    """Clip to a norm without reading the norm on the CPU (how torch.nn.utils.clip_grad_norm_ does it)."""
    def clip_to_norm_fixed(x, max_norm=1.0):
        return x * torch.clamp(max_norm / (x.norm() + 1e-6), max=1.0)  # min(1, max_norm / norm), on the GPU

    print(check_capturable(clip_to_norm_fixed, x))
    clip_verify = ...
    if cuda:
        g = capture(clip_to_norm_fixed, x)
        clip_verify = verify(g, clip_to_norm_fixed, x)
        print(clip_verify)
    return {"clip_to_norm_fixed": clip_to_norm_fixed, "clip_verify": clip_verify}
