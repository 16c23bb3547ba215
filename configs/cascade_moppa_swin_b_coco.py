# The paper's COCO detector under a short name:
#   tools/dist_train.sh configs/cascade_moppa_swin_b_coco.py 8
_base_ = './moppa/cascade-mask-rcnn_moppa-swin-b-p4-w7_fpn_ms-crop-3x_coco.py'
