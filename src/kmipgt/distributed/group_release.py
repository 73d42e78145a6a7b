"""Let ``destroy_process_group`` free the default group: import ``torch.distributed.nn`` before it exists.

``torch.distributed.nn`` binds the default group of the moment of its first import into its functions'
defaults, and ``torch._dynamo`` imports it (on the first custom-op call, such as the first k-MIP search).
A group bound there is never freed: ``destroy_process_group`` then leaves its gloo worker threads running
into interpreter shutdown, where one that releases a finished collective's tensors aborts the process
("terminate called without an active exception") after the script's work is done. The modules that
communicate import this one, so a script that imports them before ``init_process_group`` (and kmipgt's
own launcher) binds nothing.
"""

import torch.distributed.nn  # noqa: F401
