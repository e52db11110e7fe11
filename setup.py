"""The one thing pyproject.toml cannot say: the optional C extension of the dispatcher.

`optional=True`: where it does not build (no compiler, no Python headers), the package installs
without it and broker/native.py falls back to the Python dispatcher.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "broker._dispatch_native",
            ["broker/dispatch_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
