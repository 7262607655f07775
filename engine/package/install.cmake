# Install rules (included from engine/CMakeLists.txt when KVHEAD_INSTALL):
#   <prefix>/include/kvhead/        the public headers and the generated version.h
#   <prefix>/lib/libkvhead.so.*     shared (SOVERSION = major version)
#   <prefix>/lib/libkvhead.a        static
#   <prefix>/lib/cmake/kvhead/      kvheadConfig.cmake, its version file, the targets
#   <prefix>/lib/pkgconfig/kvhead.pc
# Every installed file refers to the others relatively: the prefix can move.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvhead ${PROJECT_BINARY_DIR}/include/kvhead
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")
install(TARGETS kvhead kvhead_static EXPORT kvheadTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

set(kvhead_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvhead)
install(EXPORT kvheadTargets NAMESPACE kvhead:: DESTINATION ${kvhead_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvheadConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/kvheadConfig.cmake INSTALL_DESTINATION ${kvhead_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/kvheadConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/kvheadConfig.cmake ${PROJECT_BINARY_DIR}/package/kvheadConfigVersion.cmake
        DESTINATION ${kvhead_cmake_dir})

# kvhead.pc finds the prefix from its own folder (pkg-config's ${pcfiledir}):
# "../.." for lib/pkgconfig, one more level for a multiarch lib/<triplet>.
file(RELATIVE_PATH kvhead_pc_to_prefix /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" kvhead_pc_to_prefix "${kvhead_pc_to_prefix}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/kvhead.pc.in ${PROJECT_BINARY_DIR}/package/kvhead.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/kvhead.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
