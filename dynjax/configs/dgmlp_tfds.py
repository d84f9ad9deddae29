"""DynamicGate-MLP and baselines on a TFDS dataset you have prepared (dynjax never downloads).

    tfds build cifar10 --data_dir=/data/tfds --file_format=array_record      # once, yourself
    python train.py --config=configs/dgmlp_tfds.py:dgate,cifar10 \\
        --config.data.data_dir=/data/tfds --workdir=runs/cifar10_dgate

The argument is METHOD,DATASET: presets (hidden widths) for cifar10, tiny_imagenet and
speech_commands (needs TensorFlow); any other TFDS name with an image or audio feature and
a label works with the default widths.
Depth: docs/data.md#the-dynamicgate-mlp-config-on-tfds-dynjaxconfigsdgmlp_tfdspy
"""
import ml_collections

from dynjax.configs import mlp_common

HIDDEN = {"cifar10": (1024, 1024), "tiny_imagenet": (1024, 1024), "speech_commands": (512, 512)}


def get_config(arg: str = "dgate,cifar10"):
    method, _, name = arg.partition(",")
    if not name:
        raise ValueError(f"configs/dgmlp_tfds.py needs METHOD,DATASET (e.g. dgate,cifar10), "
                         f"got {arg!r}")
    c = mlp_common.base(method, f"tfds:{name}")
    c.model.hidden = HIDDEN.get(name, (512, 512))
    c.data.tfds_input_key = ml_collections.FieldReference(None, field_type=str)  # inferred
    c.data.tfds_label_key = "label"
    return c
