"""PlatformIO custom test runner written by tinyproto into <project>/test/test_custom_runner.py.

The test firmware (test/test_model/test_main.c) prints Unity's line format itself, so no Unity library is
needed -- nothing is downloaded and `pio test` works offline. This runner reuses PlatformIO's Unity output
parser and only drops the Unity library dependency and its generated config files.

- `pio test -e uno_sim`: test_testing_command runs the ELF in tinyproto's simulated Uno (stdin/stdout);
  a non-zero simulator exit (crash, cycle timeout) fails the run.
- `pio test -e uno` / `-e uno_offline`: uploads to a real Uno and reads its serial port at test_speed.
"""

from platformio.public import UnityTestRunner


class CustomTestRunner(UnityTestRunner):
    EXTRA_LIB_DEPS = None  # no throwtheswitch/Unity from the registry

    def configure_build_env(self, env):
        return env  # no unity_config.h / unity_config.c generation
