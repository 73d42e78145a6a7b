# The public names of kmipgt.train, listed once. Type checkers read these imports as its re-exports
# (hence `as name`); at run time kmipgt.lazy.lazy_package reads them as __all__ and as the submodule
# each name is imported from on first use.

from .choices import METRICS as METRICS
from .compiled import CompiledModel as CompiledModel
from .config import Config as Config
from .config import load_config as load_config
from .export import export_model as export_model
from .export import export_run as export_run
from .fit import fit as fit
from .loop import Trainer as Trainer
from .metrics import compute_metric as compute_metric
from .models import build_model as build_model
from .predictions import predict as predict
from .predictions import write_predictions as write_predictions
from .run import evaluate_run as evaluate_run
from .run import load_run as load_run
from .run import split_graph as split_graph
from .run import train as train
from .tasks.base import SplitGraph as SplitGraph
