"""What a module-parallel pipeline buys: its measured throughput beside the ideal K-device speed-up.

The ideal speed-up comes from each module's measured step time (a pipeline on K devices is paced
by its slowest module); the measured one trains the synchronous trainer and the pipeline at each
staleness on the same config, data and device, in one invocation.
"""

from functools import partial
from pathlib import Path

import torch

from infopro.bench import StepTimer
from infopro.config import TrainConfig, build_net
from infopro.device import configure_backends, place, prepare_input
from infopro.distributed import Rank, spawn_ranks
from infopro.module_parallel import ideal_speedup, module_parameters, module_sgd, train_rank
from infopro.runs import last_epoch_images_per_second
from infopro.step import module_step
from infopro.train import train


def module_seconds(config: TrainConfig, device: torch.device, steps: int = 5) -> list[float]:
    """Median compute time of each module's step (forward, backward, SGD) on one device, one process.

    The inputs of the ideal-speed-up model: a pipeline on K devices is paced by the slowest.
    """
    configure_backends(device)
    net = place(build_net(config), device)
    optimizers = [module_sgd(net, module_parameters(net, k), config) for k in range(net.K)]
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(config.batch_size, 3, 32, 32, device=device, generator=generator)
    y = torch.randint(0, 10, (config.batch_size,), device=device, generator=generator)
    timers = [StepTimer(device) for _ in range(net.K)]
    for step in range(steps + 1):  # the first step warms up
        h = prepare_input(x, device)
        for k, optimizer in enumerate(optimizers):
            if step:
                timers[k].start()
            optimizer.zero_grad(set_to_none=True)
            h, _, _ = module_step(net.local_modules[k], h, x, y, config.precision)
            optimizer.step()
            if step:
                timers[k].stop()
    return [sorted(t)[len(t) // 2] for t in (timer.seconds() for timer in timers)]


def compare_throughput(config: TrainConfig, staleness: list[int], folder, device: torch.device,
                       log=print) -> list[dict]:
    """Images/s of the last epoch: synchronous trainer, then the pipeline at each staleness.

    Same config, data and device, one invocation; the ideal K-device speed-up from the
    measured per-module times is written beside every row, and each measurement is logged
    as it ends (each trains two epochs: minutes on CPU).
    """
    folder = Path(folder)
    seconds = module_seconds(config, device)
    model = {"module_ms": ";".join(f"{1000 * s:.2f}" for s in seconds), "ideal_speedup": ideal_speedup(seconds)}
    # Eager, as every rank of the pipeline steps: the comparison is between trainers, not step modes.
    train(config, folder / "synchronous", device=device.type, log=lambda line: None, step_mode="eager")
    synchronous = last_epoch_images_per_second(folder / "synchronous")
    log(f"K={config.K} synchronous: {synchronous:.1f} images/s")
    rows = [{"trainer": "synchronous", "ranks": 1, "max_staleness": None, "images_per_second": synchronous,
             "speedup": 1.0}]
    for s in staleness:
        run = folder / f"pipeline-S{s}"
        spawn_ranks(partial(train_rank_quietly, config=config, out=run, max_staleness=s), config.K, device)
        speed = last_epoch_images_per_second(run)
        log(f"K={config.K} module-parallel, max staleness {s}: {speed:.1f} images/s")
        rows.append({"trainer": "module-parallel", "ranks": config.K, "max_staleness": s, "images_per_second": speed,
                     "speedup": speed / synchronous})
    return [{"K": config.K, "regime": config.regime, "seed": config.seed} | row | model for row in rows]


def train_rank_quietly(me: Rank, config: TrainConfig, out, max_staleness: int) -> None:
    train_rank(config, out, me, max_staleness=max_staleness, log=lambda line: None)
