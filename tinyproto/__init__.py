"""tinyproto: budgeted classifiers compiled to int8 C for the smallest microcontrollers."""

__version__ = "0.1.0"

__all__ = ["__version__", "ProtoNNClassifier"]


def __getattr__(name: str):
    # Lazy so that `tinyproto --help` does not import scikit-learn.
    if name == "ProtoNNClassifier":
        from tinyproto.families.protonn.train import ProtoNNClassifier

        return ProtoNNClassifier
    if name == "FlyNNClassifier":
        from tinyproto.families.flynn.train import FlyNNClassifier

        return FlyNNClassifier
    raise AttributeError(name)
