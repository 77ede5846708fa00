"""Exceptions raised by gradzip: every error it raises on purpose is a :class:`GradzipError`.

Every problem with a payload raises a subclass of :class:`PayloadError` whose message names the
problem (truncation, checksum, version, codec, shape, dtype, step, seed, ...). All of them are
also ``ValueError``s so that callers that only know the standard library can still catch them.
"""

from __future__ import annotations


class GradzipError(Exception):
    """Base class of every error gradzip raises on purpose."""


class NonFiniteInputError(GradzipError, ValueError):
    """The tensor to encode holds NaN or +-Inf (spec 0.3); no state was touched."""


class CheckpointError(GradzipError, ValueError):
    """A ``load_state_dict`` was given a state it cannot restore (missing or malformed entries,
    a negative step or counter, a slot listed twice); the object was left unchanged. Also: a
    state file gradzip wrote (``checkpoint.pt`` of ``gradzip train``) is corrupted, truncated
    or has no digest (:mod:`gradzip.state_file`); the message names the file, nothing was
    loaded from it and no file was changed."""


class PayloadError(GradzipError, ValueError):
    """A payload cannot be decoded."""


class TruncatedPayloadError(PayloadError):
    """The payload is shorter than its header says, or than its body needs."""


class CorruptPayloadError(PayloadError):
    """The payload's bytes are not a valid gradzip payload."""


class ChecksumMismatchError(CorruptPayloadError):
    """The CRC32 stored in the payload does not match its bytes."""


class UnsupportedVersionError(PayloadError):
    """The payload was written with a wire-format version this library cannot read."""


class UnknownCodecError(PayloadError):
    """The payload names a codec id that no registered compressor owns."""


class PayloadMismatchError(PayloadError):
    """The payload is valid but is not what the receiver expects (shape, dtype, parameters)."""


class KeyMismatchError(PayloadMismatchError):
    """The payload's randomness keys (run seed, rank, step, tensor index) differ from the
    receiver's: its shared dither would not be regenerated correctly."""


class ConfigError(GradzipError, ValueError):
    """A training option is invalid; the message names the option and the fix."""


class NonFiniteSenderError(ChecksumMismatchError):
    """A device payload its sender marked invalid: the sender's input held NaN or Inf (its
    encoder complements the CRC instead of reading a flag back; see
    :func:`gradzip.device.payloads.poisoned`)."""
