"""``tfsift.callbacks``: Keras callbacks for a partitioned run.

Keras' own callbacks work on a ``DistributedModel`` (``ModelCheckpoint`` saves through the
model's collective ``save``/``save_weights``; what a callback prints or writes comes from
rank 0); ``BackupAndRestore`` here replaces Keras' one.
"""

from tfsift.training.callbacks import BackupAndRestore

__all__ = ["BackupAndRestore"]
