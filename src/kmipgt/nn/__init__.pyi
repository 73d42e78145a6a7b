# The public names of kmipgt.nn, listed once. Type checkers read these imports as its re-exports
# (hence `as name`); at run time kmipgt.lazy.lazy_package reads them as __all__ and as the submodule
# each name is imported from on first use.

from .attention import FullAttention as FullAttention
from .attention import GRFAttention as GRFAttention
from .attention import KMIPAttention as KMIPAttention
from .attention import PerformerAttention as PerformerAttention
from .attention import ProjectedAttention as ProjectedAttention
from .attention import build_global_attention as build_global_attention
from .attention_kinds import ATTENTION_KINDS as ATTENTION_KINDS
from .attention_kinds import AttentionKind as AttentionKind
from .attention_options import AttentionOptions as AttentionOptions
from .baselines import BaselineModel as BaselineModel
from .choices import BASELINE_KINDS as BASELINE_KINDS
from .cores import AttentionCore as AttentionCore
from .cores import FullCore as FullCore
from .cores import KMIPCore as KMIPCore
from .cores import PerformerCore as PerformerCore
from .encoders import CategoricalEncoder as CategoricalEncoder
from .encoders import EdgeEncoder as EdgeEncoder
from .encoders import FourierFeatures as FourierFeatures
from .encoders import NodeEncoder as NodeEncoder
from .gated_gcn import GatedGCNLayer as GatedGCNLayer
from .gps_conv import KMIPGPSConv as KMIPGPSConv
from .gps_layer import GPSLayer as GPSLayer
from .grf_core import GRFCore as GRFCore
from .grf_core import GRFWalkCache as GRFWalkCache
from .grf_core import share_walk_caches as share_walk_caches
from .local_kinds import LOCAL_KINDS as LOCAL_KINDS
from .local_kinds import LocalKind as LocalKind
from .local_kinds import build_local_mpnn as build_local_mpnn
from .model import GraphTransformer as GraphTransformer
from .model import MLPHead as MLPHead
from .norms import build_norm as build_norm
