# The kvshim command (tools/kvshim.c, tools/cmd_*.c); include()d from tests/CMakeLists.txt.
# mkregion makes and holds a region for the test; kvshim-bench-cache uses its own region name.
add_executable(mkregion ${CMAKE_CURRENT_LIST_DIR}/mkregion.c)
target_link_libraries(mkregion PRIVATE kvs_cache kvs_config)
add_test(NAME tools
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tools_test.sh $<TARGET_FILE:kvshim-cli>
                 $<TARGET_FILE:mkregion> $<TARGET_FILE:kvshim>)
set_tests_properties(tools PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)
