"""Checkpoint converters (scripts, not part of the ``moppa_mm`` package):
``vit_to_mmpretrain`` (pre-trained releases), ``publish_model`` (fine-tuned
checkpoints to publish)."""
