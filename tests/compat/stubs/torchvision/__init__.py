"""Import stand-in for torchvision, for the compat tier only (never in the package).

SGLang 0.5.14 ... 0.5.20 import ``torchvision.io.decode_jpeg`` at module level in
``sglang/srt/utils/common.py`` (0.5.21 made it lazy), and PyPI's torchvision does not
import beside the CPU torch the light tier runs on. The relay never decodes images; a
call to anything here is a test-environment bug and says so."""
