#!/usr/bin/python3
"""Print the golden numbers of src/optim/optim_more_test.cpp as C++ constants.

Usage (Debian's python3-torch; only /usr/bin/python3 has torch):

    /usr/bin/python3 tools/make_optim_golden.py > /tmp/golden.inc

and paste the output into the test (the test does not read any file). The oracles are outside
meshtrain:
  - SGD:      torch.optim.SGD (param groups for per-segment weight decay), 5 steps.
  - AdamW:    torch.optim.AdamW with two param groups (weight decay 0.1 and 0.0), 5 steps.
  - Lamb:     a straight transcription of DeepSpeed's FusedLamb (deepspeed/ops/lamb/fused_lamb.py,
              csrc/lamb/fused_lamb_cuda_kernel.cu) in numpy float32, one call per parameter tensor.
  - OneCycle: a transcription of DeepSpeed's OneCycle (deepspeed/runtime/lr_schedules.py) driven by
              a stand-in optimizer with Adam's `betas` default.
  - LRRangeTest: a transcription of DeepSpeed's LRRangeTest (the same file), likewise.

Inputs are formulas the test evaluates the same way (double, then rounded to f32):
    p0[i] = f32(scale_k * 0.5 * cos(0.7 i + 0.3))   i the flat index, scale_k per segment
    g_t[i] = f32(sin(1.3 i + 0.7 t) * (1 + 0.1 t))   t = 1..steps
"""

from __future__ import annotations

import math

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds_schedules import LRRangeTest, OneCycle, WarmupCosineLR  # noqa: E402

STEPS = 5


def init_params(sizes, scales):
    out, i = [], 0
    for n, s in zip(sizes, scales):
        out.append(np.array([s * 0.5 * math.cos(0.7 * (i + j) + 0.3) for j in range(n)], dtype=np.float32))
        i += n
    return out


def grads(sizes, t):
    out, i = [], 0
    for n in sizes:
        out.append(np.array([math.sin(1.3 * (i + j) + 0.7 * t) * (1.0 + 0.1 * t) for j in range(n)],
                            dtype=np.float32))
        i += n
    return out


def emit(name, values, fmt="%.9g"):
    flat = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values]) if isinstance(values, list) \
        else np.asarray(values, dtype=np.float64).ravel()
    body = ", ".join(fmt % x for x in flat)
    print(f"constexpr double {name}[] = {{{body}}};")


# ---- SGD vs torch.optim.SGD ----
def torch_sgd(sizes, decays, grad_scale, **kw):
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in init_params(sizes, [1.0] * len(sizes))]
    groups = [{"params": [p], "weight_decay": wd} for p, wd in zip(params, decays)]
    opt = torch.optim.SGD(groups, foreach=False, **kw)
    for t in range(1, STEPS + 1):
        for p, g in zip(params, grads(sizes, t)):
            p.grad = torch.from_numpy(g) * grad_scale  # grad_scale is a power of two: exact
        opt.step()
    bufs = [opt.state[p]["momentum_buffer"].numpy() for p in params]
    return [p.detach().numpy() for p in params], bufs


SGD_SIZES = [5, 3, 4]
print("// SGD: sizes {5, 3, 4}, weight decay {0.01, 0.0, 0.05}, grads x0.5, lr 0.1")
p, b = torch_sgd(SGD_SIZES, [0.01, 0.0, 0.05], 0.5, lr=0.1, momentum=0.9, dampening=0.1)
print("// momentum 0.9, dampening 0.1")
emit("kSgdMomentumParams", p)
emit("kSgdMomentumBuffer", b)
p, b = torch_sgd(SGD_SIZES, [0.01, 0.0, 0.05], 0.5, lr=0.1, momentum=0.9, nesterov=True)
print("// momentum 0.9, nesterov")
emit("kSgdNesterovParams", p)
emit("kSgdNesterovBuffer", b)


# ---- AdamW vs torch.optim.AdamW with two param groups ----
ADAMW_SIZES = [6, 4, 5]
params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in init_params(ADAMW_SIZES, [1.0] * 3)]
opt = torch.optim.AdamW([{"params": [params[0], params[2]], "weight_decay": 0.1},
                         {"params": [params[1]], "weight_decay": 0.0}],
                        lr=0.01, betas=(0.9, 0.95), eps=1e-8, foreach=False)
for t in range(1, STEPS + 1):
    for q, g in zip(params, grads(ADAMW_SIZES, t)):
        q.grad = torch.from_numpy(g)
    opt.step()
print("// AdamW: sizes {6, 4, 5}, weight decay {0.1, 0.0, 0.1}, lr 0.01, betas (0.9, 0.95), eps 1e-8")
emit("kAdamWParams", [q.detach().numpy() for q in params])


# ---- Lamb: DeepSpeed FusedLamb, transcribed ----
f32 = np.float32


def fused_lamb_cuda(p, m, v, g, lr, beta1, beta2, max_coeff, min_coeff, eps, grad_scale, step, mode,
                    bias_correction, decay):
    """csrc/lamb/fused_lamb_cuda_kernel.cu, fused_lamb_cuda + kernels part1..3, in f32, as
    deepspeedai/DeepSpeed has it (e5d277f): m and v are divided by their bias corrections and the
    step is lr (microsoft/DeepSpeed's older kernel folded sqrt(bc2) / bc1 into the step size)."""
    b1, b2, eps, decay = f32(beta1), f32(beta2), f32(eps), f32(decay)
    bc1 = bc2 = f32(1)
    if bias_correction == 1:
        bc1 = f32(1 - math.pow(f32(beta1), step))
        bc2 = f32(1 - math.pow(f32(beta2), step))
    step_size = f32(lr)
    scaled_grad = g / f32(grad_scale)
    pj = p.copy()
    m[:] = b1 * m + (f32(1) - b1) * scaled_grad
    v[:] = b2 * v + (f32(1) - b2) * scaled_grad * scaled_grad
    m_hat = m / bc1
    v_hat = v / bc2
    denom = np.sqrt(v_hat + eps) if mode == 0 else np.sqrt(v_hat) + eps
    update = m_hat / denom + decay * pj
    reg_w = f32(math.sqrt(float(np.sum(pj.astype(np.float64) ** 2))))
    reg_u = f32(math.sqrt(float(np.sum(update.astype(np.float64) ** 2))))
    lamb_coeff = f32(1.0)
    if reg_w != 0 and reg_u != 0:
        lamb_coeff = reg_w / reg_u
        if lamb_coeff > max_coeff:
            lamb_coeff = f32(max_coeff)
        if lamb_coeff < min_coeff:
            lamb_coeff = f32(min_coeff)
    p[:] = pj - (step_size * lamb_coeff * update)
    return float(lamb_coeff)


def fused_lamb_run(sizes, scales, decays, lr, betas, eps, eps_inside_sqrt, bias_correction,
                   max_grad_norm, scale, max_coeff=10.0, min_coeff=0.01):
    """deepspeed/ops/lamb/fused_lamb.py FusedLamb.step, one param group per segment (its weight
    decay), grads passed in, grad_norms = the global norm of the (scaled) grads for every param."""
    ps = init_params(sizes, scales)
    ms = [np.zeros_like(p) for p in ps]
    vs = [np.zeros_like(p) for p in ps]
    coeffs_per_step = []
    for step in range(1, STEPS + 1):
        gs = grads(sizes, step)
        grad_norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in gs))
        coeffs = []
        for p, m, v, g, wd in zip(ps, ms, vs, gs, decays):
            combined_scale = scale
            if max_grad_norm > 0:
                clip = ((grad_norm / scale) + 1e-6) / max_grad_norm
                if clip > 1:
                    combined_scale = clip * scale
            coeffs.append(fused_lamb_cuda(p, m, v, g, lr, betas[0], betas[1], max_coeff, min_coeff, eps,
                                          combined_scale, step, 0 if eps_inside_sqrt else 1,
                                          1 if bias_correction else 0, wd))
        coeffs_per_step.append(coeffs)
    return ps, ms, vs, coeffs_per_step


LAMB_SIZES = [6, 4, 5, 3]
LAMB_SCALES = [1.0, 0.0, 1000.0, 1e-4]  # ordinary, all zero (coeff falls back to 1), max, min clamp
LAMB_DECAYS = [0.01, 0.0, 0.1, 0.05]
print("// Lamb: sizes {6, 4, 5, 3}, weight scales {1, 0, 1000, 1e-4}, weight decay {0.01, 0, 0.1, 0.05}")
ps, ms, vs, coeffs = fused_lamb_run(LAMB_SIZES, LAMB_SCALES, LAMB_DECAYS, 0.01, (0.9, 0.999), 1e-6, False, True,
                                    0.0, 1.0)
print("// lr 0.01, betas (0.9, 0.999), eps 1e-6 outside sqrt, bias correction, no clipping, scale 1")
emit("kLambParams", ps)
emit("kLambExpAvg", ms)
emit("kLambExpAvgSq", vs)
emit("kLambCoeffsStep1", coeffs[0])
emit("kLambCoeffs", coeffs[-1])
ps, ms, vs, coeffs = fused_lamb_run(LAMB_SIZES, LAMB_SCALES, LAMB_DECAYS, 0.02, (0.8, 0.99), 1e-4, True, False,
                                    1.5, 2.0)
print("// lr 0.02, betas (0.8, 0.99), eps 1e-4 inside sqrt, no bias correction, max_grad_norm 1.5,")
print("// scale 2 (grad_scale 0.5 here)")
emit("kLambClipParams", ps)
emit("kLambClipCoeffs", coeffs[-1])


# ---- OneCycle: DeepSpeed's lr_schedules.py, transcribed ----
class StandInOptimizer:
    def __init__(self):
        self.defaults = {"lr": 0.0, "betas": (0.9, 0.999)}
        self.param_groups = [{"lr": 0.0, "betas": (0.9, 0.999)}]


def one_cycle_trace(iters, **kw):
    opt = StandInOptimizer()
    sched = OneCycle(opt, **kw)
    lrs, moms = [opt.param_groups[0]["lr"]], [opt.param_groups[0]["betas"][0]]  # iteration -1
    for _ in range(iters):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
        moms.append(opt.param_groups[0]["betas"][0])
    assert all(opt.param_groups[0]["betas"][1] == 0.99 for _ in [0])
    return lrs, moms


print("// OneCycle at iterations -1..24: min_lr 0.01, max_lr 0.1, first 4, second 6, decay_step_size 3,")
print("// decay_lr_rate 0.5, min_mom 0.85, max_mom 0.95, decay_mom_rate 0.02")
lrs, moms = one_cycle_trace(25, cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=4,
                            cycle_second_step_size=6, decay_step_size=3, decay_lr_rate=0.5,
                            cycle_min_mom=0.85, cycle_max_mom=0.95, decay_mom_rate=0.02)
emit("kOneCycleLr", lrs, "%.17g")
emit("kOneCycleMom", moms, "%.17g")
print("// OneCycle at iterations -1..14: min_lr 1e-4, max_lr 1e-3, first 5, second None, no decay")
lrs, moms = one_cycle_trace(15, cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=5)
emit("kOneCycleNoDecayLr", lrs, "%.17g")
emit("kOneCycleNoDecayMom", moms, "%.17g")


print("// OneCycle's staircase at iterations -1..24: min_lr 0.01, max_lr 0.1, first 4 (2 stairs), second 6")
print("// (3 stairs), decay_step_size 3, decay_lr_rate 0.5, min_mom 0.85, max_mom 0.95, decay_mom_rate 0.02")
lrs, moms = one_cycle_trace(25, cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=4,
                            cycle_second_step_size=6, cycle_first_stair_count=2, cycle_second_stair_count=3,
                            decay_step_size=3, decay_lr_rate=0.5, cycle_min_mom=0.85, cycle_max_mom=0.95,
                            decay_mom_rate=0.02)
emit("kOneCycleStairLr", lrs, "%.17g")
emit("kOneCycleStairMom", moms, "%.17g")
print("// the same with first 5 (4 stairs), second None (the first's 4 stairs), no decay")
lrs, moms = one_cycle_trace(15, cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=5,
                            cycle_first_stair_count=4)
emit("kOneCycleStairNoneLr", lrs, "%.17g")


def lr_trace(schedule, iters, lr=0.0, **kw):
    """The lr a schedule gives at iterations -1 .. iters - 1 (an optimizer whose lr starts at lr)."""
    opt = StandInOptimizer()
    opt.param_groups[0]["lr"] = lr
    sched = schedule(opt, **kw)
    lrs = [opt.param_groups[0]["lr"]]  # iteration -1
    for _ in range(iters):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def cosine_trace(iters, **kw):
    return lr_trace(WarmupCosineLR, iters, lr=1e-3, **kw)


print("// WarmupCosineLR (lr 1e-3) at iterations -1..13: total 6, warmup 2 linear, cos_min_ratio 0.1")
emit("kCosinePastTotal", cosine_trace(14, total_num_steps=6, warmup_num_steps=2, cos_min_ratio=0.1,
                                      warmup_type="linear"), "%.17g")
print("// total 3 <= warmup 3 (log): the floor from the warm-up's end")
emit("kCosineNoWindow", cosine_trace(8, total_num_steps=3, warmup_num_steps=3, cos_min_ratio=0.1), "%.17g")


def lr_range_test_trace(iters, **kw):
    return lr_trace(LRRangeTest, iters, **kw)


print("// LRRangeTest at iterations -1..9: min_lr 0.002, step_size 3, step_rate 0.5, continuous")
emit("kLrRangeTest", lr_range_test_trace(10, lr_range_test_min_lr=0.002, lr_range_test_step_size=3,
                                         lr_range_test_step_rate=0.5), "%.17g")
print("// the same, staircase")
emit("kLrRangeTestStaircase", lr_range_test_trace(10, lr_range_test_min_lr=0.002, lr_range_test_step_size=3,
                                                  lr_range_test_step_rate=0.5, lr_range_test_staircase=True), "%.17g")
