"""The one thing pyproject.toml cannot say: the optional C extensions, the dispatcher's, the
log flusher's fsync thread and the remoting frame decoder's.

`optional=True`: where one does not build (no compiler, no Python headers), the package installs
without it; broker/native.py falls back to the Python dispatcher, dledger/log/flusher.py to
trio's worker threads, remoting/frame.py to its Python decoder.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "broker._dispatch_native",
            ["broker/dispatch_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        ),
        Extension(
            "dledger.log._sync_native",
            ["dledger/log/sync_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        ),
        Extension(
            "remoting._frame_native",
            ["remoting/frame_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        ),
    ]
)
