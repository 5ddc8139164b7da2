# Lumigo injector bootstrap for CPython. lumigo_injector.so puts this directory first on
# PYTHONPATH of Python processes that have a LUMIGO_TRACER_TOKEN, so the interpreter imports this
# file at start-up (site.py imports `sitecustomize`).
#
# It picks the payload built for this interpreter (CPython minor version x libc), appends it to
# sys.path, imports the Lumigo OpenTelemetry distro (which initialises itself on import), and then
# runs the sitecustomize the user would have had without us. Tracing must never break the
# application: an unsupported interpreter, an application that already ships OpenTelemetry, or
# any error while loading the distro only means "not traced".
#
# All tracer traffic goes to LUMIGO_ENDPOINT / LUMIGO_LOGS_ENDPOINT (the telemetry proxy): the
# distro's dependency report, which only ever goes straight to Lumigo's public endpoint, is off
# unless the user sets LUMIGO_REPORT_DEPENDENCIES. And a failed export (proxy down) is one line
# on stderr, never a traceback in the application's output (unless LUMIGO_DEBUG=true).
#
# Written in a syntax that Python 2.7 still parses, because an unversioned `python` may be 2.7.
import os
import sys

SUPPORTED = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))
DISTRO = "lumigo_opentelemetry"
# The distro posts a dependency report to a fixed public URL (not LUMIGO_ENDPOINT) unless this is
# "false"; a pod usually cannot reach it, and the report would bypass the proxy if it could.
REPORT_DEPENDENCIES = "LUMIGO_REPORT_DEPENDENCIES"
# Parent of every logger of the OpenTelemetry SDK and exporters (all ours: we stand down when the
# application has OpenTelemetry), and the distro's own logger.
OTEL_LOGGER = "opentelemetry"
DISTRO_LOGGER = "lumigo-opentelemetry"


def _flag(name):
    return os.environ.get(name, "").lower() in ("true", "1")


def _debug(message):
    if _flag("LUMIGO_INJECTOR_DEBUG"):
        sys.stderr.write("lumigo-injector: python: %s\n" % message)


class _OneLineFormatter(object):
    """Wraps a logging formatter: the exception goes on the message's line, with no traceback."""

    def __init__(self, inner, suffix=""):
        self.inner = inner
        self.suffix = suffix

    def format(self, record):
        import copy

        error = record.exc_info[1] if record.exc_info else None
        plain = copy.copy(record)
        plain.exc_info, plain.exc_text, plain.stack_info = None, None, None
        text = self.inner.format(plain)
        if error is not None:
            text += ": %s: %s" % (type(error).__name__, error)
        return text + self.suffix


class _OncePerMessage(object):
    """A failing export repeats with every batch while the proxy is unreachable: say it once."""

    def __init__(self):
        self.seen = set()

    def filter(self, record):
        key = (record.name, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def quiet_export_errors():
    """OpenTelemetry's warnings and errors go to stderr as single lines, each message once,
    instead of propagating to the root logger, whose last-resort handler prints the traceback of
    every failed export into the application's output. Other loggers, the root logger and the
    application's own logging configuration are not touched."""
    import logging

    otel = logging.getLogger(OTEL_LOGGER)
    if otel.handlers:  # configured by someone already: theirs
        return
    handler = logging.StreamHandler()  # stderr
    handler.setLevel(logging.WARNING)
    handler.setFormatter(
        _OneLineFormatter(
            logging.Formatter("lumigo-injector: python: %(name)s: %(message)s"),
            " (repeats are not printed; LUMIGO_DEBUG=true prints all)",
        )
    )
    handler.addFilter(_OncePerMessage())
    otel.addHandler(handler)
    otel.propagate = False


def _no_tracebacks_from_distro_logger():
    """The distro's logger has its own stderr handler: keep its format, drop the tracebacks."""
    import logging

    for handler in logging.getLogger(DISTRO_LOGGER).handlers:
        if not isinstance(handler.formatter, _OneLineFormatter):
            handler.setFormatter(_OneLineFormatter(handler.formatter or logging.Formatter()))


def detect_libc():
    """'glibc' or 'musl': which manylinux / musllinux wheels this interpreter can load."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        version = None
    return "glibc" if version and version.startswith("glibc") else "musl"


def payload_dirs(root, version_info, libc, implementation, gil_disabled):
    """The sys.path entries for this interpreter, or (None, reason) when it is not supported."""
    if implementation != "cpython":
        return None, "implementation %s is not supported" % implementation
    minor = tuple(version_info[:2])
    if minor not in SUPPORTED:
        return None, "Python %d.%d is not supported" % minor
    if gil_disabled:
        return None, "free-threaded CPython is not supported"
    abi_dir = os.path.join(root, "cp%d%d-%s" % (minor[0], minor[1], libc))
    if not os.path.isdir(abi_dir):
        return None, "no payload for this interpreter at %s" % abi_dir
    return [abi_dir, os.path.join(root, "common")], None


def _app_has_opentelemetry():
    """The application brings its own OpenTelemetry: mixing two SDKs breaks both, stand down."""
    try:
        import importlib.util

        return importlib.util.find_spec("opentelemetry") is not None
    except Exception:
        return True


def _activate(here):
    if not os.environ.get("LUMIGO_TRACER_TOKEN"):
        _debug("LUMIGO_TRACER_TOKEN is not set; not tracing")
        return
    try:
        import sysconfig

        gil_disabled = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    except Exception:
        gil_disabled = False
    implementation = getattr(getattr(sys, "implementation", None), "name", "cpython2")
    root = os.path.dirname(here)
    dirs, reason = payload_dirs(root, sys.version_info, detect_libc(), implementation, gil_disabled)
    if dirs is None:
        _debug("%s; not tracing" % reason)
        return
    if _app_has_opentelemetry():
        _debug("the application already has OpenTelemetry; not tracing")
        return
    # Appended, never prepended: the application's own packages always win.
    sys.path.extend(dirs)
    # /opt/lumigo is mounted read-only: never try to write .pyc files into the payload (and keep
    # a writable copy, like build/payload in tests, identical to what the image ships).
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    quiet = not _flag("LUMIGO_DEBUG")
    if quiet:
        quiet_export_errors()
    # Set only while the distro initialises (it reads it on import), so the application and its
    # child processes see their environment unchanged.
    defaulted = REPORT_DEPENDENCIES not in os.environ
    if defaulted:
        os.environ[REPORT_DEPENDENCIES] = "false"
    try:
        __import__(DISTRO)
        if quiet:
            _no_tracebacks_from_distro_logger()
        _debug("tracing with %s from %s" % (DISTRO, dirs[0]))
    except Exception as error:  # the distro failed: leave the app as it would be without us
        for entry in dirs:
            while entry in sys.path:
                sys.path.remove(entry)
        sys.stderr.write(
            "lumigo-injector: python: tracing not activated: %s: %s\n"
            % (type(error).__name__, error)
        )
    finally:
        sys.dont_write_bytecode = dont_write
        if defaulted:
            os.environ.pop(REPORT_DEPENDENCIES, None)


def _chain_user_sitecustomize(here):
    """Import the next `sitecustomize` on sys.path, the one this file shadows."""
    ours = sys.modules.get("sitecustomize")
    while here in sys.path:
        sys.path.remove(here)  # also keeps our directory out of the application's sys.path
    del sys.modules["sitecustomize"]
    try:
        __import__("sitecustomize")
    except ImportError as error:
        missing = getattr(error, "name", None) == "sitecustomize" or str(error).endswith(
            "named sitecustomize"
        )
        if not missing:
            raise
        sys.modules["sitecustomize"] = ours


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _activate(here)
    except Exception as error:  # never let tracing stop the interpreter
        _debug("bootstrap failed: %s" % error)
    _chain_user_sitecustomize(here)


if __name__ == "sitecustomize":
    _main()
