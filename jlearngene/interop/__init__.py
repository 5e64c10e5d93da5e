"""Interoperability with other ecosystems' checkpoints: state dict files and the checks every
converter shares (`state_dict`), timm / DeiT state dicts (`timm`), big_vision and ViT /
AugReg checkpoints (`big_vision`), LeTra's official Aux-Net (`lets`); and the ViT as a Flax
NNX module (`nnx`, imported on its own)."""
from jlearngene.interop.state_dict import (StateDictError, check_params, file_kind,
                                           load_state_dict, read_safetensors_metadata,
                                           save_safetensors)
from jlearngene.interop.timm import (check_state_dict, from_timm, has_embed_class, infer_config,
                                     timm_kwargs, timm_shapes, to_timm)

__all__ = ['StateDictError', 'check_params', 'check_state_dict', 'file_kind', 'from_timm',
           'has_embed_class', 'infer_config', 'load_state_dict', 'read_safetensors_metadata',
           'save_safetensors', 'timm_kwargs', 'timm_shapes', 'to_timm']
