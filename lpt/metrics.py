"""Agreement between a reference tensor and a candidate, accumulated over batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Agreement:
    """Streaming sums for SQNR, cosine similarity and absolute errors (float64)."""

    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    candidate_energy: float = 0.0
    abs_error_sum: float = 0.0
    max_abs_error: float = 0.0
    count: int = 0

    def add(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        r = np.asarray(reference, np.float64).reshape(-1)
        c = np.asarray(candidate, np.float64).reshape(-1)
        error = r - c
        self.signal += float(r @ r)
        self.noise += float(error @ error)
        self.dot += float(r @ c)
        self.candidate_energy += float(c @ c)
        self.abs_error_sum += float(np.abs(error).sum())
        self.max_abs_error = max(self.max_abs_error, float(np.abs(error).max(initial=0)))
        self.count += r.size

    def merge(self, other: Agreement) -> Agreement:
        """Fold in `other`'s sums (other samples; lpt.distributed): equal to one pass to float64 rounding."""
        self.signal += other.signal
        self.noise += other.noise
        self.dot += other.dot
        self.candidate_energy += other.candidate_energy
        self.abs_error_sum += other.abs_error_sum
        self.max_abs_error = max(self.max_abs_error, other.max_abs_error)
        self.count += other.count
        return self

    @property
    def sqnr_db(self) -> float:
        """10·log10(Σ ref² / Σ (ref − cand)²); +inf when they are equal."""
        if self.noise == 0:
            return float("inf")
        if self.signal == 0:
            return float("-inf")
        return 10 * np.log10(self.signal / self.noise)

    @property
    def cosine(self) -> float:
        denominator = np.sqrt(self.signal * self.candidate_energy)
        return float(self.dot / denominator) if denominator else 1.0

    @property
    def mean_abs_error(self) -> float:
        return self.abs_error_sum / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {"sqnr_db": self.sqnr_db, "cosine": self.cosine, "max_abs_err": self.max_abs_error,
                "mean_abs_err": self.mean_abs_error}


@dataclass
class TopOne:
    """Top-1 accuracy of reference and candidate (with labels), or their agreement (without); with
    labels and five classes or more, top-5 accuracy too (`top5`)."""

    reference_correct: int = 0
    candidate_correct: int = 0
    agree: int = 0
    count: int = 0
    reference_top5_correct: int = 0
    candidate_top5_correct: int = 0
    top5: bool = False

    def add(self, reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None = None) -> None:
        r, c = np.argmax(reference, axis=-1), np.argmax(candidate, axis=-1)
        self.agree += int((r == c).sum())
        if labels is not None:
            labels = np.asarray(labels).reshape(r.shape)
            self.reference_correct += int((r == labels).sum())
            self.candidate_correct += int((c == labels).sum())
            if reference.shape[-1] >= 5:
                self.top5 = True
                self.reference_top5_correct += _in_top5(reference, labels)
                self.candidate_top5_correct += _in_top5(candidate, labels)
        self.count += r.size

    def merge(self, other: TopOne) -> TopOne:
        """Fold in `other`'s counts (other samples; lpt.distributed): exact."""
        self.reference_correct += other.reference_correct
        self.candidate_correct += other.candidate_correct
        self.agree += other.agree
        self.count += other.count
        self.reference_top5_correct += other.reference_top5_correct
        self.candidate_top5_correct += other.candidate_top5_correct
        self.top5 = self.top5 or other.top5
        return self

    @property
    def reference_top5(self) -> float:
        return self.reference_top5_correct / self.count if self.count else 0.0

    @property
    def candidate_top5(self) -> float:
        return self.candidate_top5_correct / self.count if self.count else 0.0

    @property
    def reference_accuracy(self) -> float:
        return self.reference_correct / self.count if self.count else 0.0

    @property
    def candidate_accuracy(self) -> float:
        return self.candidate_correct / self.count if self.count else 0.0

    @property
    def agreement(self) -> float:
        return self.agree / self.count if self.count else 0.0


def _in_top5(scores: np.ndarray, labels: np.ndarray) -> int:
    """How many labels are among their row's five highest scores (ties as argpartition breaks them)."""
    top = np.argpartition(scores, -5, axis=-1)[..., -5:]
    return int((top == labels[..., None]).any(axis=-1).sum())


def is_classifier_output(array: np.ndarray) -> bool:
    """[N, classes] with at least two classes: an output top-1 means something for."""
    return array.ndim == 2 and array.shape[1] >= 2
