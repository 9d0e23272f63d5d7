"""`funnel serve`: check the funnels, then run uvicorn with the app factory.

uvicorn's worker processes build the app themselves (``create_app()`` reads
the environment), so everything is passed down as ``FUNNEL_*`` variables:
the funnels, the database URL (the embedded server is started here, once,
when none is given), the model, a shared widget-token secret and a shared
metrics folder.

``SIGHUP`` reloads the funnels without a restart (engine.service.reload): with one
worker the app handles it itself; with several, this process hands it to every
worker, and each validates and takes the edit on its own.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import inspect
import multiprocessing
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InvalidInput
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..llm.models import make_model
from ..store.embedded import embedded_url
from ..turn import language
from .config import LIFESPAN_SHUTDOWN_SECONDS, ServiceConfig, check_key_funnels
from .preloaded import share_compiled

APP = "engine.service.app:create_app"

# SIGTERM (or Ctrl-C): requests in flight get at most GRACEFUL_SECONDS; then the app's own
# shutdown (engine.service.app: the retention scheduler, the reloader, the outbox
# dispatcher, the Telegram channel, the engines' background work, the database pool, the
# model clients) at most LIFESPAN_SHUTDOWN_SECONDS. So a process exits within
# SHUTDOWN_BOUND_SECONDS of the signal whatever its hooks do (they run in daemon threads).
GRACEFUL_SECONDS = 20
SHUTDOWN_BOUND_SECONDS = GRACEFUL_SECONDS + LIFESPAN_SHUTDOWN_SECONDS


def proxy_options(trusted: list[str]) -> dict[str, Any]:
    """uvicorn's proxy settings: ``X-Forwarded-For`` is believed only from the proxies in
    ``FUNNEL_TRUSTED_PROXIES`` (none by default; uvicorn's own default trusts loopback, so
    any local process could choose its client address and escape the rate limit)."""
    if not trusted:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": ",".join(trusted)}


# How long uvicorn's supervisor waits for a worker to answer its health check before it
# kills it (uvicorn's default: 5 s). A worker starting on a busy machine imports litellm
# and loads the language models for tens of seconds, holding the GIL for long stretches;
# at 5 s the supervisor killed and restarted every worker in a loop on a loaded 2-core
# machine. A worker that is really hung is still replaced, a minute later.
WORKER_HEALTHCHECK_SECONDS = 60


def preload(compiled: list[CompiledFunnel], model: str | None, api_base: str | None) -> None:
    """Load here, once, what every worker loads the same at its start: litellm (unless
    every model is the offline one), the language models of the funnels' detectors, the
    compiled funnels (engine.service.preloaded) and the app's modules. Forked
    workers then share these pages with this process instead of each holding a copy
    (bench/start.py --workers 2: the PSS per worker). Frozen out of the garbage collector
    (``gc.freeze``), whose passes would write to every object and unshare its page."""
    names = {model} if model else {c.spec.model.name for c in compiled}
    for name in sorted(names):
        if not name.startswith("scripted"):
            # Constructing imports litellm; its warm-up call stays in the worker (it
            # starts litellm's logging thread, which a fork would not carry over). The
            # model's tokenizer does not: loaded here, its ~110 MB (o200k and litellm's
            # default cl100k) are shared, where each worker held a copy of its own.
            load_tokenizer = getattr(make_model(name, api_base=api_base), "load_tokenizer", None)
            if load_tokenizer is not None:
                load_tokenizer()
    for funnel in compiled:
        if funnel.spec.language_policy.mode != "model":
            language.warm(funnel.spec.language_policy.candidates)
        share_compiled(funnel)  # the workers take it instead of compiling their own
    importlib.import_module(APP.partition(":")[0])
    gc.freeze()


def _run_workers(config: Any, folder: str | None) -> None:
    """uvicorn's worker supervisor, except that SIGHUP is handed to every worker (each
    reloads its funnels, engine.service.reload) instead of replacing the workers: a
    replacement would drop nothing, but it would not validate an edit before taking it.
    The workers are forked rather than spawned, so that they share what :func:`preload`
    loaded."""
    import uvicorn
    import uvicorn._subprocess
    from prometheus_client.multiprocess import mark_process_dead
    from uvicorn.supervisors.multiprocess import Multiprocess

    # uvicorn starts its workers with the "spawn" context (its module attribute `spawn`,
    # not a setting): each would import litellm and load the language models again,
    # ~300 MB per worker. Forked, they share the master's pages (bench/start.py).
    uvicorn._subprocess.spawn = multiprocessing.get_context("fork")  # type: ignore[assignment]

    class Workers(Multiprocess):
        def keep_subprocess_alive(self) -> None:
            # A worker that died without its shutdown (killed, crashed) leaves its live
            # gauges (turns in flight...) in the metrics folder: drop them when uvicorn
            # replaces it. Its counts stay, so the service's totals do not fall.
            before = [process.pid for process in self.processes]
            super().keep_subprocess_alive()
            for pid, process in zip(before, self.processes, strict=True):
                if pid is not None and pid != process.pid and folder:
                    mark_process_dead(pid, folder)  # type: ignore[no-untyped-call]

        def handle_hup(self) -> None:
            print(f"funnel serve: SIGHUP: reloading the funnels in {len(self.processes)} "
                  "workers", file=sys.stderr)
            for process in self.processes:
                if process.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGHUP)

    sock = config.bind_socket()
    if "target" in inspect.signature(Multiprocess.__init__).parameters:  # older uvicorn
        server = uvicorn.Server(config)
        Workers(config, target=server.run, sockets=[sock]).run()  # type: ignore[call-arg]
    else:
        Workers(config, sockets=[sock]).run()


def serve(funnels: list[str], *, db: str | None, host: str, port: int, workers: int,
          model: str | None, api_base: str | None = None,
          structured_output: str | None = None) -> int:
    try:
        import uvicorn  # the optional `serve` extra
    except ImportError:
        raise ConfigError("`funnel serve` needs starlette and uvicorn: "
                          "pip install 'funnel-engine[serve]'") from None
    if workers < 1:
        raise InvalidInput("--workers must be at least 1")
    names: dict[str, str] = {}
    loaded: list[CompiledFunnel] = []
    for path in funnels:
        compiled = load_funnel(path)  # FunnelInvalid: the CLI prints every problem
        if compiled.name in names:
            raise InvalidInput(f"{path} and {names[compiled.name]} are both named "
                              f"'{compiled.name}'")
        names[compiled.name] = path
        loaded.append(compiled)
    env = os.environ
    env["FUNNEL_SERVE_FUNNELS"] = os.pathsep.join(str(Path(p).resolve()) for p in funnels)
    if db is None and not env.get("FUNNEL_DB"):
        db = embedded_url()  # one server for every worker, stopped when this process ends
    if db:
        env["FUNNEL_DB"] = db
    if model:
        env["FUNNEL_MODEL"] = model
    if api_base:
        env["FUNNEL_API_BASE"] = api_base
    if structured_output:
        env["FUNNEL_STRUCTURED_OUTPUT"] = structured_output
    if not env.get("FUNNEL_SECRET"):
        env["FUNNEL_SECRET"] = secrets.token_urlsafe(32)
        print("funnel serve: FUNNEL_SECRET is not set; widget sessions end when the service "
              "restarts", file=sys.stderr)
    metrics_dir = None  # a temporary folder of our own, removed at the end
    shared = env.get("PROMETHEUS_MULTIPROC_DIR") or env.get("FUNNEL_METRICS_DIR")
    if workers > 1 and not shared:
        shared = metrics_dir = tempfile.mkdtemp(prefix="funnel-metrics-")
    if shared:
        # prometheus_client's multiprocess mode (engine.service.metrics), chosen by the
        # workers when they import it. The last run's files would add their counts to
        # this one's, and prometheus_client asks for the folder to be emptied at start.
        env["PROMETHEUS_MULTIPROC_DIR"] = shared
        Path(shared).mkdir(parents=True, exist_ok=True)
        for old in Path(shared).glob("*.db"):
            old.unlink(missing_ok=True)
    config = ServiceConfig.from_env()  # fail here, once, on a malformed variable
    check_key_funnels(config, names)  # a key limited to a funnel not served
    if not config.api_keys:
        print("funnel serve: FUNNEL_API_KEYS is not set; only the widget and Telegram can "
              "converse", file=sys.stderr)
    print(f"funnel serve: {', '.join(sorted(names))} on http://{host}:{port} "
          f"({workers} worker{'s' if workers > 1 else ''}); "
          f"{'edits to the funnels are taken as saved, ' if config.reload else ''}"
          "SIGHUP reloads them", file=sys.stderr)
    level = env.get("FUNNEL_LOG_LEVEL", "info")
    options: dict[str, Any] = {
        "factory": True, "host": host, "port": port, "workers": workers, "ws": "none",
        # A request head must be complete within 10 s (slowloris: engine.service.protocol).
        "http": "engine.service.protocol:HeadDeadlineProtocol",
        # SIGTERM: requests in flight get at most 20 s; hooks are bounded on their own
        # (a turn's by its deadline, a handoff hook's delivery by 10 s: engine.funnel.hooks).
        "timeout_graceful_shutdown": GRACEFUL_SECONDS,
        "log_level": level, "log_config": log_config(uvicorn.config.LOGGING_CONFIG, level),
        **proxy_options(config.trusted_proxies)}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config.__init__).parameters:
        options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_SECONDS
    try:
        if workers > 1:
            preload(loaded, env.get("FUNNEL_MODEL"), env.get("FUNNEL_API_BASE"))
            _run_workers(uvicorn.Config(APP, **options), env.get("PROMETHEUS_MULTIPROC_DIR"))
        else:  # one process: the app's own SIGHUP handler reloads (engine.service.app)
            uvicorn.run(APP, **options)
    finally:
        if metrics_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def log_config(base: dict[str, Any], level: str) -> dict[str, Any]:
    """uvicorn's logging (``base``), plus the engine's own loggers (``funnel.*``: the
    scheduled purge's line, hand-off alerts, outbox failures) on its stream and level."""
    config = copy.deepcopy(base)
    config["loggers"]["funnel"] = {"handlers": ["default"], "level": level.upper(),
                                   "propagate": False}
    return config

