"""Generated demo data and small "pre-trained" checkpoints for the quick starts
and the tests (scripts, not part of the ``moppa_mm`` package): ``coco_shapes``
(detection), ``vtab_task`` (classification), ``ade_scenes`` (segmentation)."""
