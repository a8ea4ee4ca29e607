"""Scale-out on Ray: the batches of a calibration or evaluation pass shared among Ray workers.

    lpt.calibrate(model, "photos/", ray="local")                 # ray.init() on this machine
    lpt.compare(fp32, fq, "val/", ray="ray://head:10001")      # an existing Ray cluster

This process reads the data (CalibrationData.batches(): the same batches, preprocessing and
subset as without Ray) and hands each batch to the least busy of `workers` Ray actors, at most
IN_FLIGHT per worker, so memory stays bounded. Each actor holds its own onnxruntime session
(calibration) or its own compiled plan (evaluation) and folds its batches into its own state:

    calibration   the range collectors and input means of lpt.calibration.steps, merged with their
                  `merge` methods (lpt.calibration.estimators): min/max and the mean's sums exactly;
                  histograms on shared bin edges, so also exactly: the first worker takes the first
                  batches alone until every histogram has a bin width, and the others start from it
                  (HistogramCollector.seeded); from then on a value's bin depends on the final width only.
    evaluation    lpt.compare.Tallies (SQNR sums, top-1 counts), merged: top-1 exactly, SQNR to float64
                  rounding (the sums are added in another order).

Ray is an optional dependency (pip install 'lpt[ray]'); without it, asking for it is a one-line LptError.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import deque

import numpy as np
import onnx
import onnx_ir as ir

from lpt.calibration.data import CalibrationData
from lpt.calibration.progress import sample_progress
from lpt.calibration.statistics import fold, session, warn_nonfinite, with_outputs
from lpt.errors import LptError
from lpt.model_io import to_proto

logger = logging.getLogger(__name__)

LOCAL = "local"  # `--ray` without an address: ray.init() on this machine, with its CPUs
IN_FLIGHT = 2  # batches queued per worker: one running, one on its way
SEED_BATCHES = 8  # at most this many batches on the first worker alone to give every histogram its bin width


def connect(address: str | None = LOCAL):
    """The ray module, initialized: an existing ray.init() is kept; else ray.init(address) ("local": this machine)."""
    try:
        import ray
    except ImportError:
        raise LptError("--ray needs Ray, an optional dependency: pip install 'lpt[ray]'") from None
    if not ray.is_initialized():
        local = address in (None, "", LOCAL)
        if not local:
            _check_reachable(address)
        try:
            ray.init(address=None if local else address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        except Exception as err:  # noqa: BLE001 - Ray's connection errors have many types: say it in one line
            line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise LptError(f"--ray {address or LOCAL}: cannot start or reach Ray: {line}") from None
    return ray


def _check_reachable(address: str, seconds: float = 5.0) -> None:
    """A one-line error, within seconds, for a host:port (or ray://host:port) that does not answer: Ray
    itself retries an unknown or silent address for minutes before giving up."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as err:
        raise LptError(f"--ray {address}: cannot reach {host}:{port} ({err.strerror or err})") from None


def worker_count(ray, workers: int | None) -> int:
    """`workers`, or one per CPU of the Ray cluster."""
    if workers is not None:
        if workers < 1:
            raise LptError(f"ray workers {workers}: must be at least 1")
        return workers
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class _Batches:
    """How to count and split a batch (what statistics.fold needs of CalibrationData), from the specs alone."""

    def __init__(self, specs):
        self.specs = specs

    samples_in = CalibrationData.samples_in
    part = CalibrationData.part
    fixed_batch = CalibrationData.fixed_batch


class StatisticsWorker:
    """One shard's statistics: an onnxruntime session of the model with the tensors as outputs."""

    def __init__(self, proto: bytes, fetched: list[str], specs: dict):
        self.sess = session(onnx.ModelProto.FromString(proto)) if fetched else None
        self.fetched, self.batches = fetched, _Batches(specs)
        self.collectors: dict[str, list] = {}
        self.per_sample = 0

    def start(self, collectors: dict[str, list], per_sample: int) -> None:
        # A copy: arrays that come through Ray's object store are read-only, and histograms count in place.
        self.collectors, self.per_sample = copy.deepcopy(collectors), per_sample

    def add(self, batch: dict) -> tuple[int, int]:
        """Fold a batch in: (its samples, the histograms still without a bin width)."""
        self.per_sample = fold(self.sess, self.fetched, self.collectors, self.batches, batch, self.per_sample)
        unseeded = sum(getattr(c, "width", 1.0) == 0.0 for cs in self.collectors.values() for c in cs)
        return self.batches.samples_in(batch), unseeded

    def seeds(self) -> tuple[dict[str, list], int]:
        """Empty collectors on this worker's histogram bin edges, for the other workers to start from."""
        return {name: [c.seeded() for c in cs] for name, cs in self.collectors.items()}, self.per_sample

    def state(self) -> tuple[dict[str, list], int]:
        return self.collectors, self.per_sample


class Worker:
    """A Ray actor kept for the next pass (starting one costs seconds: a process importing lpt): `load`
    gives it a StatisticsWorker or EvaluationWorker job, whose methods it forwards."""

    def __init__(self):
        self.job = None

    def load(self, job: type, *args) -> None:
        self.job = None  # the last pass's models go before the next ones load
        self.job = job(*args)

    def start(self, *args):
        return self.job.start(*args)

    def add(self, *args):
        return self.job.add(*args)

    def seeds(self):
        return self.job.seeds()

    def state(self):
        return self.job.state()


_pool: dict = {"job": None, "actors": []}  # the actors of this Ray session (its job id), reused by each pass


def workers_for(ray, job: type, args: list, workers: int | None) -> list:
    """`workers` actors (started once per Ray session, then reused), each loaded with `job(*args)`."""
    n = worker_count(ray, workers)
    session = ray.get_runtime_context().get_job_id()
    if _pool["job"] != session:
        _pool.update(job=session, actors=[])
    actor = ray.remote(num_cpus=1)(Worker)
    while len(_pool["actors"]) < n:
        _pool["actors"].append(actor.remote())
    pool = _pool["actors"][:n]
    _get(ray, [w.load.remote(job, *args) for w in pool])
    return pool


class EvaluationWorker:
    """One shard's evaluation: the reference and the candidate (compiled once: lpt.compare.Evaluator)."""

    def __init__(self, reference: bytes, candidate: bytes, backend: str, per_layer: bool):
        from lpt.compare import Evaluator

        self.evaluator = Evaluator(_model(reference), _model(candidate), backend=backend, per_layer=per_layer)

    def add(self, batch: dict, labels) -> tuple[int, int]:
        self.evaluator.add(batch, labels)
        return 0, 0

    def state(self):
        return self.evaluator.tallies, self.evaluator.precisions


def collect(model: ir.Model, collectors: dict[str, list], data: CalibrationData, *, quiet: bool = False,
            address: str | None = LOCAL, workers: int | None = None) -> int:
    """statistics.collect on Ray: `collectors` (tensor name → collectors) get the merged statistics of
    every batch of `data`, in place. Returns the bytes the fetched tensors take per sample."""
    ray = connect(address)
    inputs = set(data.specs)
    fetched = [n for n in collectors if n not in inputs]
    proto = ray.put(with_outputs(model, fetched).SerializeToString()) if fetched else None
    pool = workers_for(ray, StatisticsWorker, [proto, fetched, data.specs], workers)
    batches = iter(data.batches())
    start = time.perf_counter()
    with sample_progress("calibrating on Ray", data.total, quiet) as advance:
        # The first worker alone until every histogram has a bin width: the edges all workers share.
        _get(ray, pool[0].start.remote(collectors, 0))
        for _, batch in zip(range(SEED_BATCHES), batches):
            samples, unseeded = _get(ray, pool[0].add.remote(batch))
            advance(samples)
            if not unseeded:
                break
        seeds = pool[0].seeds.remote()
        seeded, per_sample = _get(ray, seeds)
        _get(ray, [w.start.remote(seeded, per_sample) for w in pool[1:]])
        _dispatch(ray, pool, ((batch,) for batch in batches), advance)
        states = _get(ray, [w.state.remote() for w in pool])
    for state, _ in states:  # in the workers' order: the first holds the first batches
        for name, mine in collectors.items():
            for collector, theirs in zip(mine, state[name]):
                collector.merge(theirs)
    warn_nonfinite(collectors)
    logger.info("statistics of %d samples on %d Ray workers in %.2f s", data.count, len(pool),
                time.perf_counter() - start)
    return states[0][1] or per_sample


def evaluate(reference: ir.Model, candidate: ir.Model, data: CalibrationData, labels: np.ndarray | None, *,
             address: str | None = LOCAL, workers: int | None = None, backend: str = "lpt",
             per_layer: bool = False):
    """lpt.compare's evaluation on Ray: (merged lpt.compare.Tallies, {probed tensor: precision})."""
    ray = connect(address)
    models = [ray.put(to_proto(m).SerializeToString()) for m in (reference, candidate)]
    pool = workers_for(ray, EvaluationWorker, [*models, backend, per_layer], workers)

    def labelled():
        seen = 0
        for batch in data.batches():
            rows = data.samples_in(batch)
            yield batch, None if labels is None else labels[seen:seen + rows]
            seen += rows

    _dispatch(ray, pool, labelled(), lambda samples: None)
    states = _get(ray, [w.state.remote() for w in pool])
    tallies, precisions = states[0]
    for other, _ in states[1:]:
        tallies.merge(other)
    return tallies, precisions


def _dispatch(ray, pool: list, calls, advance) -> None:
    """`add(*call)` on the least busy worker for each call, at most IN_FLIGHT queued per worker."""
    pending: dict = {}  # object ref → worker index
    busy = [0] * len(pool)
    done: deque = deque()
    for call in calls:
        while min(busy) >= IN_FLIGHT:
            ready, _ = ray.wait(list(pending), num_returns=1)
            done.extend(ready)
            for ref in ready:
                busy[pending.pop(ref)] -= 1
            advance(sum(samples for samples, _ in _get(ray, list(done))))
            done.clear()
        index = busy.index(min(busy))
        pending[pool[index].add.remote(*call)] = index
        busy[index] += 1
    advance(sum(samples for samples, _ in _get(ray, list(pending))))


def _get(ray, refs):
    """ray.get, with an lpt error raised in a worker raised here as it is (one line, not Ray's traceback)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, LptError):
            raise cause from None
        raise


def _model(proto: bytes) -> ir.Model:
    return ir.serde.deserialize_model(onnx.ModelProto.FromString(proto))
