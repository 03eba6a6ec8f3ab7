"""Optional dependencies: one clear error when a feature's extra is not installed.

The base install (`pip install -e .`) stays lean; features that need more
declare an extra in `setup.cfg` (e.g. `affnist` for reading the real affNIST
`.mat` files with SciPy) and import it through `require`, which names the
package and the install command instead of ending in a `ModuleNotFoundError`
traceback.
"""

import importlib

__all__ = ["MissingDependencyError", "require"]


class MissingDependencyError(ImportError):
    """A feature needs a package that is not installed; the message says how to get it."""


def require(module, extra, feature):
    """Imports `module`, or raises `MissingDependencyError` naming `extra`.

    Args:
        module: the module to import, e.g. `"scipy.io"`.
        extra: the `capsnet_tf` extra that installs it, e.g. `"affnist"`.
        feature: what needs it, for the message, e.g. `"reading affNIST .mat files"`.

    Returns:
        The imported module.

    Example:

    >>> require("json", "none", "nothing").__name__
    'json'
    >>> require("no_such_module_xyz", "affnist", "reading affNIST .mat files")
    Traceback (most recent call last):
    ...
    capsnet_tf.extras.MissingDependencyError: reading affNIST .mat files needs the \
package 'no_such_module_xyz', which is not installed: pip install -e ".[affnist]" \
(or pip install no_such_module_xyz)
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        package = module.split(".")[0]
        raise MissingDependencyError(
            f"{feature} needs the package {package!r}, which is not installed: "
            f'pip install -e ".[{extra}]" (or pip install {package})'
        ) from None
