"""Small models this project trains itself: data generators, configs, training CLIs, metrics."""
