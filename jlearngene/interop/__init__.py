"""Interoperability with other ecosystems' checkpoints: timm / DeiT state dicts (`timm`), big_vision
and ViT / AugReg checkpoints (`big_vision`), LeTra's official Aux-Net (`lets`)."""
from jlearngene.interop.timm import (StateDictError, check_params, check_state_dict, file_kind,
                                     from_timm, has_embed_class, infer_config, load_state_dict,
                                     read_safetensors_metadata, save_safetensors, timm_kwargs,
                                     timm_shapes, to_timm)

__all__ = ['StateDictError', 'check_params', 'check_state_dict', 'file_kind', 'from_timm',
           'has_embed_class', 'infer_config', 'load_state_dict', 'read_safetensors_metadata',
           'save_safetensors', 'timm_kwargs', 'timm_shapes', 'to_timm']
