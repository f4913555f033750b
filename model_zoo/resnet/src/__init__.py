"""Building blocks of the ResNet model zoo entry (network, loss, schedules, data, config, callbacks)."""
