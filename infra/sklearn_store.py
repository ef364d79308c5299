"""scikit-learn models on disk without pickle: skops files loaded against an explicit allow-list.

Why skops and not ONNX: ``skl2onnx`` 1.20 (the latest) cannot convert a
``HistGradientBoosting*`` model of our scikit-learn 1.9 / numpy 2.4 (it fails building the
``TreeEnsembleClassifier`` node: numpy booleans where ONNX wants ints), while skops writes the
fitted estimator as a JSON schema + arrays and rebuilds it without ``pickle``: only types of
scikit-learn/numpy that skops trusts, plus those named in :data:`TRUSTED_TYPES`, can be
instantiated; a file that names any other type is refused before anything is built. The
scores are then bit-identical to the fitted model's (the same sklearn predictor runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.errors import RegistryError
from infra.sealed import read_artifact

#: Types a stored model may name beyond skops' own trusted defaults (the boosting trees'
#: predictor, a plain container of numpy arrays).
TRUSTED_TYPES: tuple[str, ...] = ("sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",)


def save_estimator(estimator: Any, path: Path) -> Path:
    """Write a fitted estimator as a skops file (no pickle)."""
    import skops.io as sio

    path.parent.mkdir(parents=True, exist_ok=True)
    sio.dump(estimator, path)
    return path


def load_estimator(path: Path, trusted: tuple[str, ...] = TRUSTED_TYPES) -> Any:
    """Rebuild an estimator from a skops file of a registry version, refusing any type outside
    ``trusted``; a sealed file is decrypted in memory (infra.sealed).

    Raises:
        RegistryError: the file is missing, cannot be opened (:class:`~infra.sealed.SealError`) or
            names a type that is not allowed.
    """
    import skops.io as sio

    if not path.is_file():
        raise RegistryError(f"model file {path} is missing")
    data = read_artifact(path)
    untrusted = sio.get_untrusted_types(data=data)
    refused = sorted(set(untrusted) - set(trusted))
    if refused:
        raise RegistryError(f"{path} names types outside the allow-list, refused: {refused}")
    return sio.loads(data, trusted=list(trusted))
