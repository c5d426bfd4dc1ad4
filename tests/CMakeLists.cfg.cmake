# Configuration module tests; include()d from tests/CMakeLists.txt.
add_executable(check_config check_config.c)
target_link_libraries(check_config PRIVATE kvs_config_tools PkgConfig::CHECK)
add_test(NAME check_config COMMAND check_config)
