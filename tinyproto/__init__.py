"""tinyproto: budgeted classifiers compiled to int8 C for the smallest microcontrollers."""

from tinyproto.core.version import __version__

__all__ = ["__version__", "ProtoNNClassifier"]


def __getattr__(name: str):
    # Lazy so that `tinyproto --help` does not import scikit-learn; each family declares its estimator's class.
    if name.endswith("Classifier"):
        from tinyproto.families import estimator_class

        found = estimator_class(name)
        if found is not None:
            return found
    raise AttributeError(name)
