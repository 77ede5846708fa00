"""The Fréchet distance between two sets of feature vectors (Dowson & Landau 1982), the
formula of the FID (Heusel et al. 2017) with any feature extractor."""

from __future__ import annotations

import torch


def gaussian_frechet(
    mu1: torch.Tensor, cov1: torch.Tensor, mu2: torch.Tensor, cov2: torch.Tensor
) -> float:
    """``||mu1 - mu2||^2 + Tr(cov1 + cov2 - 2 (cov1 cov2)^{1/2})``: the squared 2-Wasserstein
    distance between ``N(mu1, cov1)`` and ``N(mu2, cov2)``.

    ``Tr (cov1 cov2)^{1/2}`` is computed as the sum of the square roots of the eigenvalues of
    the symmetric ``cov1^{1/2} cov2 cov1^{1/2}`` (same spectrum, and ``eigh`` is stable where a
    general matrix square root of the non-symmetric product is not); float64 throughout,
    tiny negative eigenvalues from rounding are clamped to 0.
    """
    mu1, mu2 = mu1.double().reshape(-1), mu2.double().reshape(-1)
    cov1, cov2 = cov1.double(), cov2.double()
    k = mu1.numel()
    if mu2.numel() != k or cov1.shape != (k, k) or cov2.shape != (k, k):
        raise ValueError(
            f"means of {mu1.numel()} and {mu2.numel()} entries and covariances of shapes "
            f"{tuple(cov1.shape)}, {tuple(cov2.shape)} do not match"
        )
    evals, evecs = torch.linalg.eigh((cov1 + cov1.T) / 2)
    root1 = evecs @ torch.diag(evals.clamp(min=0).sqrt()) @ evecs.T
    middle = root1 @ cov2 @ root1
    cross = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp(min=0).sqrt().sum()
    value = (mu1 - mu2).square().sum() + cov1.trace() + cov2.trace() - 2 * cross
    return max(0.0, float(value))


def frechet_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The Fréchet distance between the Gaussians fitted to feature sets ``a`` and ``b``
    (``n_a x k`` and ``n_b x k``; sample mean and unbiased covariance).

    With Inception-v3 pool features this is the FID; gradzip's experiments use the features of
    a small MNIST classifier instead (``gradzip_lab.reproduce.dqgan.mnist_features``), which is
    *not* the FID and not comparable with published FID numbers. The estimate is biased upwards
    for finite ``n`` (by about ``Tr`` of the covariances' estimation noise), so compare values
    computed from the same ``n``.
    """
    for name, x in (("a", a), ("b", b)):
        if x.dim() != 2 or x.shape[0] < 2:
            raise ValueError(f"feature set {name} must be n x k with n >= 2, got {tuple(x.shape)}")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"feature set {name} holds NaN or Inf")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature sets have {a.shape[1]} and {b.shape[1]} features")
    a, b = a.double(), b.double()
    return gaussian_frechet(a.mean(0), torch.cov(a.T), b.mean(0), torch.cov(b.T))
