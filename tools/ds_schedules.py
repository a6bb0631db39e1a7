"""DeepSpeed's OneCycle LR/momentum schedule (deepspeed/runtime/lr_schedules.py, the version with
_get_scale_factor and the stair counts), its WarmupCosineLR (the progress clamped at 1) and its LRRangeTest, transcribed for the golden-data scripts: they drive a torch
optimizer's param_groups ("lr", and "betas" while OneCycle cycles momentum) exactly as DeepSpeed's
classes do. Call step() after each optimizer step, as DeepSpeed's engine does."""

import math


class OneCycle:
    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0., cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9,
                 decay_mom_rate=0., last_batch_iteration=-1):
        self.optimizer = optimizer
        cycle_first_step_size = float(cycle_first_step_size)
        cycle_second_step_size = float(cycle_second_step_size) if cycle_second_step_size is not None \
            else cycle_first_step_size
        self.total_size = cycle_first_step_size + cycle_second_step_size
        self.step_ratio = cycle_first_step_size / self.total_size
        self.first_step_size = cycle_first_step_size
        self.second_step_size = cycle_second_step_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = cycle_first_stair_count if cycle_second_stair_count is None \
            else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        self.skip_lr_decay = self.skip_mom_decay = math.isclose(self.decay_step_size, 0)
        self.min_lrs = [cycle_min_lr] * len(optimizer.param_groups)
        if last_batch_iteration == -1:
            for lr, group in zip(self.min_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = [cycle_max_lr] * len(optimizer.param_groups)
        self.decay_lr_rate = decay_lr_rate
        if math.isclose(self.decay_lr_rate, 0):
            self.skip_lr_decay = True
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.decay_mom_rate = decay_mom_rate
            self.min_moms = [(cycle_min_mom, 0.99)] * len(optimizer.param_groups)
            self.max_moms = [(cycle_max_mom, 0.99)] * len(optimizer.param_groups)
            if last_batch_iteration == -1:
                for momentum, group in zip(self.min_moms, optimizer.param_groups):
                    group["betas"] = momentum
            if math.isclose(self.decay_mom_rate, 0):
                self.skip_mom_decay = True
        self.last_batch_iteration = last_batch_iteration

    def _get_scale_factor(self):
        batch_iteration = (self.last_batch_iteration + 1)
        cycle = math.floor(1 + batch_iteration / self.total_size)
        x = 1. + batch_iteration / self.total_size - cycle
        if x <= self.step_ratio:
            scale_factor = x / self.step_ratio
            stair_count = self.first_stair_count
        else:
            scale_factor = (x - 1) / (self.step_ratio - 1)
            stair_count = self.second_stair_count
        # The staircase (DeepSpeed 22779f2): from the integer batch offset in the cycle.
        if stair_count > 0:
            cycle_iteration = batch_iteration % self.total_size
            if cycle_iteration <= self.first_step_size:
                stair_position = cycle_iteration * stair_count / self.first_step_size
            else:
                stair_position = (self.total_size - cycle_iteration) * stair_count / self.second_step_size
            scale_factor = math.floor(stair_position) / stair_count
        return scale_factor

    def get_lr(self):
        if self.last_batch_iteration < self.total_size:
            sf = self._get_scale_factor()
            return [lo + (hi - lo) * sf for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return self.min_lrs
        decay_interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [lo / (1 + self.decay_lr_rate * decay_interval) for lo in self.min_lrs]

    def get_mom(self):
        if self.last_batch_iteration < self.total_size:
            sf = self._get_scale_factor()
            return [(hi[0] - (hi[0] - lo[0]) * sf, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return self.max_moms
        decay_interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [(b0 * (1 + self.decay_mom_rate * decay_interval), b1) for b0, b1 in self.max_moms]

    def step(self):
        self.last_batch_iteration += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        if self.cycle_momentum:
            for group, mom in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = mom


class LRRangeTest:
    """lr = min_lr * (1 + step_rate * interval), interval = (last_batch_iteration + 1) / step_size,
    floored with staircase; the constructor sets min_lr (iteration -1)."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        self.optimizer = optimizer
        self.min_lrs = [lr_range_test_min_lr] * len(optimizer.param_groups)
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._set(self.min_lrs)

    def _set(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr

    def get_lr(self):
        interval = float(self.last_batch_iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [m * (1 + self.step_rate * interval) for m in self.min_lrs]

    def step(self):
        self.last_batch_iteration += 1
        self._set(self.get_lr())


class WarmupCosineLR:
    """DeepSpeed's WarmupCosineLR (lr_schedules.py 22779f2): a ratio of the optimizer's lr, the cosine's
    progress clamped at 1 past total_num_steps."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type="log", last_batch_iteration=-1):
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps}")
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.last_batch_iteration = last_batch_iteration
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.org_lrs = [group["lr"] for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            for group, lr in zip(optimizer.param_groups, self.get_lr()):
                group["lr"] = lr

    def get_lr_ratio(self):
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            if self.warmup_type == "log":
                ratio = self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
            else:
                ratio = self.last_batch_iteration / self.warmup_num_steps
            return self.warmup_min_ratio + ratio * (1. - self.warmup_min_ratio)
        real_last_step = self.last_batch_iteration - self.warmup_num_steps + 1
        real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        cosine_progress = min(1.0, real_last_step / real_total_steps)
        ratio = (1 + math.cos(math.pi * cosine_progress)) / 2
        return max(0.0, self.cos_min_ratio + (1. - self.cos_min_ratio) * ratio)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return [0.0 for _ in self.org_lrs]
        return [lr * self.get_lr_ratio() for lr in self.org_lrs]

    def step(self):
        self.last_batch_iteration += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
